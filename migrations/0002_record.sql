-- The system of record: every stock movement, every order, every correction.

-- Append-only ledger of movements. `qty` is the signed change to on_hand, except
-- for `correction`, which records a fix of Redis' counters (on_hand unchanged).
CREATE TABLE ledger (
    id             bigserial PRIMARY KEY,
    sku            text NOT NULL REFERENCES skus (sku),
    kind           text NOT NULL CHECK (kind IN ('receipt', 'sale', 'adjustment', 'correction')),
    qty            bigint NOT NULL,
    -- Where it came from: 'checkout' (sales), a feed's name, 'reconcile', 'manual'.
    source         text NOT NULL,
    -- Unique per source: a redelivered event can never be recorded twice.
    event_id       text NOT NULL,
    reservation_id text,
    fencing_token  bigint,
    note           text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source, event_id)
);
CREATE INDEX ledger_sku_idx ON ledger (sku, id DESC);

CREATE FUNCTION ledger_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % is not allowed', TG_OP;
END $$;
CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION ledger_is_append_only();

-- One order per reservation; a cart's lines each have a row.
CREATE TABLE orders (
    reservation_id text PRIMARY KEY,
    confirmed_at   timestamptz NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_lines (
    reservation_id text NOT NULL REFERENCES orders (reservation_id),
    sku            text NOT NULL REFERENCES skus (sku),
    qty            bigint NOT NULL CHECK (qty > 0),
    PRIMARY KEY (reservation_id, sku)
);

-- Payments that arrived after their hold ended: no stock was taken; refund or remediate.
CREATE TABLE remediations (
    id             bigserial PRIMARY KEY,
    reservation_id text NOT NULL UNIQUE,
    hold_state     text NOT NULL,
    reason         text NOT NULL,
    status         text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'refunded', 'fulfilled', 'closed')),
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Highest fencing token seen per lock: writes carrying an older one are refused.
CREATE TABLE fences (
    lock_name  text PRIMARY KEY,
    token      bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE reconciliation_runs (
    id             bigserial PRIMARY KEY,
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    trigger        text NOT NULL,
    skus_checked   integer NOT NULL DEFAULT 0,
    drifted        integer NOT NULL DEFAULT 0,
    corrected      integer NOT NULL DEFAULT 0,
    not_warmed     integer NOT NULL DEFAULT 0,
    fencing_token  bigint
);
CREATE TABLE reconciliation_results (
    run_id       bigint NOT NULL REFERENCES reconciliation_runs (id) ON DELETE CASCADE,
    sku          text NOT NULL REFERENCES skus (sku),
    on_hand      bigint NOT NULL,
    available    bigint NOT NULL,
    reserved     bigint NOT NULL,
    sold_pending bigint NOT NULL,
    drift        bigint NOT NULL,
    action       text NOT NULL CHECK (action IN ('none', 'corrected_down', 'corrected_up', 'reported')),
    PRIMARY KEY (run_id, sku)
);

-- Manual actions by people (releases, force unlocks, forced warm-ups, corrections).
CREATE TABLE audit_log (
    id         bigserial PRIMARY KEY,
    actor      text NOT NULL,
    action     text NOT NULL,
    subject    text NOT NULL,
    detail     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_created_idx ON audit_log (created_at DESC);

-- Write-behind progress per shard stream, for lag reporting.
CREATE TABLE write_behind_progress (
    shard         integer PRIMARY KEY,
    last_event_id text NOT NULL,
    last_event_ms bigint NOT NULL,
    committed_at  timestamptz NOT NULL DEFAULT now()
);

-- A sale recorded against a stale on_hand may take it below zero. Refusing it would
-- wedge the write-behind and lose the sale; instead it is recorded and
-- reconciliation reports the SKU.
ALTER TABLE skus DROP CONSTRAINT skus_on_hand_check;

-- Units of sales recorded here, ever. Redis counts the units it has settled (taken
-- out of sold_pending after a commit) in its own `settled` field; the difference is
-- sales committed here but not yet settled there, which reconciliation must not
-- mistake for drift.
ALTER TABLE skus ADD COLUMN sold_recorded bigint NOT NULL DEFAULT 0;
