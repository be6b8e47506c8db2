-- Support finds a buyer's holds through this index (newest first) instead of
-- scanning every SKU's holds in Redis: a search costs one index lookup and a
-- bounded number of reads, whoever runs it and however often.
CREATE INDEX holds_buyer_idx ON holds (buyer, created_at DESC) WHERE buyer IS NOT NULL;
