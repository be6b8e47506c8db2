-- Drops set up from a file or the API (`holdfast drop import`, PUT /api/v1/drops/{code}),
-- and the merchandiser role that does it from the dashboard.

-- The units a drop's file last gave the SKU. A change of it moves on_hand by the
-- difference; sales and feeds move on_hand without touching it, so importing the
-- same file again changes nothing. NULL (SKUs made before this column): read as
-- on_hand + sold_recorded.
ALTER TABLE skus ADD COLUMN stock_declared bigint CHECK (stock_declared >= 0);

-- Stock changes an import decided, and who decided them and why. Written in the
-- import's transaction; applied to the live counter afterwards through delta.lua
-- (source 'import', this event_id), which the write-behind records in the ledger
-- under the same event_id. A change whose application was cut short (Redis
-- down, the process killed) stays pending until the next import or server start.
CREATE TABLE stock_changes (
    event_id   text PRIMARY KEY,
    sku        text NOT NULL REFERENCES skus (sku),
    delta      bigint NOT NULL CHECK (delta <> 0),
    actor      text NOT NULL,
    reason     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    applied_at timestamptz
);
CREATE INDEX stock_changes_pending_idx ON stock_changes (created_at) WHERE applied_at IS NULL;

-- Merchandising sets up drops: a role between support and admin, not above either.
ALTER TABLE users DROP CONSTRAINT users_role_check;
ALTER TABLE users ADD CONSTRAINT users_role_check
    CHECK (role IN ('viewer', 'support', 'merchandiser', 'admin'));

-- A PIM or ERP pushes drops with a token of its own scope.
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_scopes_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_scopes_check
    CHECK (scopes <@ ARRAY['checkout', 'ingest', 'read', 'catalog']::text[] AND cardinality(scopes) > 0);
