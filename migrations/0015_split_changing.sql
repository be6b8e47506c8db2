-- Whether a change of the SKU's parts is under way, or was cut short: set
-- when the change records its target, cleared when it ends. The servers'
-- rebalancer visits these SKUs as well as the split ones, so a change cut
-- short is finished whatever its target (a merge back to one part too).
ALTER TABLE skus ADD COLUMN parts_changing boolean NOT NULL DEFAULT false;
DROP INDEX skus_split;
CREATE INDEX skus_split ON skus (sku) WHERE parts > 1 OR parts_changing;
