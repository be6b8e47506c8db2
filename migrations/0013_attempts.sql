-- Reservation attempts per SKU and second (refusals included), added to by every
-- server each second: a drop report's peak attempts per second.
CREATE TABLE attempts (
    sku text        NOT NULL,
    at  timestamptz NOT NULL,
    n   bigint      NOT NULL CHECK (n > 0),
    PRIMARY KEY (sku, at)
);
