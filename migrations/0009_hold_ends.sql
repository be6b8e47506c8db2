-- How each hold ended, as the write-behind saw it (confirmed, released or
-- expired, and when): a drop's report counts them, and support sees them.
ALTER TABLE holds ADD COLUMN ended_at timestamptz;
ALTER TABLE holds ADD COLUMN end_state text CHECK (end_state IN ('confirmed', 'released', 'expired'));
CREATE INDEX holds_sku_created_idx ON holds (sku, created_at);
