#!/usr/bin/env bash
# The engine owns every Redis key, Lua call and SQL statement: nothing outside
# engine/ (and the tests and benchmarks, which may set up or inspect real
# services) sends a Redis command, builds a key or writes SQL. Run by
# scripts/test.sh; exits non-zero naming each offending line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

pattern='redis::(cmd|pipe|Script)|\.invoke_async|sqlx::(query|query_as|query_scalar)|"hf:|\b(SELECT|INSERT INTO|UPDATE [a-z_]+ SET|DELETE FROM)\b'
found=$(grep -rnE "$pattern" app/src server/src cli/src frontend/src domain/src || true)
if [ -n "$found" ]; then
    echo "storage access outside engine/ (move it into the engine):" >&2
    echo "$found" >&2
    exit 1
fi
# The domain crate compiles to WASM and does no I/O: it depends on serde alone.
if grep -qE '^(redis|sqlx|tokio|reqwest)' domain/Cargo.toml; then
    echo "domain/Cargo.toml: the domain crate must not depend on I/O crates" >&2
    exit 1
fi
echo "boundaries hold: only engine/ talks to Redis and PostgreSQL"
