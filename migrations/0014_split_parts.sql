-- How many parts a SKU's stock is split into in Redis (1: one counter), so a
-- counter rebuilt after Redis lost data is rebuilt with its parts.
ALTER TABLE skus ADD COLUMN parts smallint NOT NULL DEFAULT 1 CHECK (parts BETWEEN 1 AND 16);
-- The few split SKUs, found without reading every row (the rebalancer's list).
CREATE INDEX skus_split ON skus (sku) WHERE parts > 1;
