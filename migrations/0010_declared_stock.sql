-- Every SKU has a declared stock, fixed when it is first seen: a SKU made
-- before drop files (or by SQL) takes on_hand + sold_recorded now, and a new row
-- without one takes its on_hand. Reading "on hand plus sold" later would move
-- with every supplier feed, and an unchanged export imported back would undo it.
UPDATE skus SET stock_declared = greatest(on_hand + sold_recorded, 0) WHERE stock_declared IS NULL;

CREATE FUNCTION skus_declare_stock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.stock_declared := coalesce(NEW.stock_declared, greatest(NEW.on_hand, 0));
    RETURN NEW;
END $$;
CREATE TRIGGER skus_declare_stock BEFORE INSERT ON skus
    FOR EACH ROW EXECUTE FUNCTION skus_declare_stock();

ALTER TABLE skus ALTER COLUMN stock_declared SET NOT NULL;

-- A stock change is applied once the ledger has it (not when Redis took it: a
-- Redis that loses its data before the write-behind records the change would
-- otherwise lose the change too).
COMMENT ON COLUMN stock_changes.applied_at IS 'when the ledger was seen to have this change';
