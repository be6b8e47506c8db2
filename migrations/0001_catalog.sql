-- The catalogue: what Holdfast sells, and the named drops that group SKUs for a sale.

CREATE TABLE skus (
    -- Letters, digits and . _ - only: SKUs become part of Redis keys and URLs.
    sku                 text PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    title               text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    -- Variants of one product (sizes, colours) share `product` so they show together.
    product             text NOT NULL CHECK (length(product) BETWEEN 1 AND 200),
    variant             text,
    on_hand             bigint NOT NULL CHECK (on_hand >= 0),
    low_stock_threshold integer NOT NULL DEFAULT 5 CHECK (low_stock_threshold >= 0),
    per_buyer_limit     integer CHECK (per_buyer_limit > 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX skus_product_idx ON skus (product);

CREATE TABLE drops (
    code       text PRIMARY KEY CHECK (code ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    name       text NOT NULL,
    starts_at  timestamptz,
    ends_at    timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (ends_at IS NULL OR starts_at IS NULL OR ends_at > starts_at)
);

CREATE TABLE drop_skus (
    drop_code text NOT NULL REFERENCES drops (code) ON DELETE CASCADE,
    sku       text NOT NULL REFERENCES skus (sku),
    position  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (drop_code, sku)
);

CREATE INDEX drop_skus_sku_idx ON drop_skus (sku);
