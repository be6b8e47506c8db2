-- Dashboard users and their sessions. Passwords are argon2id hashes; session
-- secrets are kept only as SHA-256 digests, so a database dump logs nobody in.
CREATE TABLE users (
    id                   bigserial PRIMARY KEY,
    username             text NOT NULL UNIQUE CHECK (username ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    password_hash        text NOT NULL,
    role                 text NOT NULL CHECK (role IN ('viewer', 'support', 'admin')),
    -- A generated one-time password must be replaced at the first login.
    must_change_password boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sessions (
    digest     bytea PRIMARY KEY,
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX sessions_user_idx ON sessions (user_id);
