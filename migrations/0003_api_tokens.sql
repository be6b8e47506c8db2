-- API tokens for the checkout, ingestion and read APIs. Only a SHA-256 of each
-- token is stored (tokens are 128-bit random, so a slow hash adds nothing); the
-- token itself is shown once, when created.
CREATE TABLE api_tokens (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    token_sha256 bytea NOT NULL UNIQUE,
    scopes       text[] NOT NULL CHECK (scopes <@ ARRAY['checkout', 'ingest', 'read']::text[] AND cardinality(scopes) > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz
);
