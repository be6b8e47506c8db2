-- Feed movements PostgreSQL has recorded (receipts and adjustments, summed), the
-- twin of sold_recorded: Redis counts `fed` as it applies feed events, and the
-- difference is what is in flight, so reconciliation never mistakes a feed event
-- not yet written behind for drift.
ALTER TABLE skus ADD COLUMN fed_recorded bigint NOT NULL DEFAULT 0;
