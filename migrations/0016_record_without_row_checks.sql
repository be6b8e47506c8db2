-- The write-behind records every sale as a ledger row and an order line, and
-- PostgreSQL checked each of those rows' foreign keys with a query of its own
-- (three per sale): a profile of the write-behind draining sales had those
-- checks at about a third of PostgreSQL's CPU (BENCHMARKS.md, "Run of
-- 2026-12-04, 13:45 UTC"). They guard nothing the writer does not already:
-- their writers (the write-behind; reconciliation, for corrections) insert
-- only rows whose SKU is in `skus` (their statements join it), the
-- write-behind inserts an order line only in the transaction that inserts its
-- order, and SKUs and orders are never deleted.
-- `holdfast verify` checks that it stays so ("every ledger row and order line
-- has its SKU and order").
ALTER TABLE ledger DROP CONSTRAINT ledger_sku_fkey;
ALTER TABLE order_lines DROP CONSTRAINT order_lines_reservation_id_fkey;
ALTER TABLE order_lines DROP CONSTRAINT order_lines_sku_fkey;
