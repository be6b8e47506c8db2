-- What must survive Redis losing its data, and what support must see.

-- The newest feed snapshot version applied per SKU: warm-up restores it, so a late,
-- older snapshot stays refused after a Redis restart or failover.
ALTER TABLE skus ADD COLUMN snapshot_version bigint NOT NULL DEFAULT -1;

-- Why a remediation exists: a payment after the hold ended, a sale of units a
-- feed had removed, or a confirm for a reservation Redis no longer knows.
ALTER TABLE remediations ADD COLUMN kind text NOT NULL DEFAULT 'late_payment'
    CHECK (kind IN ('late_payment', 'oversold', 'unknown_confirm'));

-- Holds as the write-behind saw them being made: who and what, so a confirm for
-- a hold Redis lost can be shown to support with its buyer and lines.
CREATE TABLE holds (
    reservation_id text NOT NULL,
    sku            text NOT NULL,
    qty            bigint NOT NULL,
    buyer          text,
    created_at     timestamptz NOT NULL,
    PRIMARY KEY (reservation_id, sku)
);
