-- Warm-up restores the guards of the feed events recorded for the SKUs it warms
-- in the last day: by SKU and time, over feed movements only (sales, by far the
-- most rows, are not read).
CREATE INDEX ledger_feed_recent_idx ON ledger (sku, created_at)
    WHERE kind IN ('receipt', 'adjustment');
