#!/usr/bin/env bash
# Runs every test: formatting and lints, unit and integration tests against real
# Redis and PostgreSQL, and the end-to-end browser tests in headless Chromium.
# Same preparation as scripts/run.sh. Nothing is skipped: a missing service or
# tool is installed or started, or the run fails saying what is missing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_e2e_tools() {
    command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
    CHROMIUM_PATH="${CHROMIUM_PATH:-$(command -v chromium || true)}"
    if [ -z "$CHROMIUM_PATH" ]; then
        apt_install chromium
        CHROMIUM_PATH=$(command -v chromium)
    fi
    export CHROMIUM_PATH
    if [ ! -d end2end/node_modules/@playwright/test ] || [ end2end/package-lock.json -nt end2end/node_modules/.package-lock.json ]; then
        say "installing the end-to-end test runner (npm ci; no browser download)"
        (cd end2end && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund)
    fi
}

free_port() {
    local p
    for p in $(shuf -i 20000-40000 -n 50); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
    done
    die "no free loopback port found"
}

# Starts a private Redis, a fresh database and the server with the demo drop, runs
# Playwright against it, and stops what it started.
E2E_PIDS=()
run_e2e() {
    local out="$HOLDFAST_ROOT/end2end/output" redis_port web_port db_url
    mkdir -p "$out"
    redis_port=$(free_port)
    web_port=$(free_port)
    db_url="$(pg_admin_url "$DATABASE_URL" | sed 's|/postgres$||')/holdfast_e2e"
    psql "$(pg_admin_url "$DATABASE_URL")" -qc 'DROP DATABASE IF EXISTS holdfast_e2e WITH (FORCE)' >/dev/null
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
        --logfile "$out/redis.log" &
    E2E_PIDS+=($!)
    DATABASE_URL="$db_url" REDIS_URL="redis://127.0.0.1:$redis_port" HOLDFAST_DEMO=true \
        HOLDFAST_LISTEN="127.0.0.1:$web_port" LEPTOS_SITE_ROOT="$HOLDFAST_ROOT/target/site" \
        "$CARGO_TARGET_DIR/debug/holdfast" serve >"$out/server.log" 2>&1 &
    E2E_PIDS+=($!)
    # Global, not local: the trap runs after this function has returned.
    trap 'kill "${E2E_PIDS[@]}" 2>/dev/null || true' EXIT
    for _ in $(seq 100); do
        curl -fsS "http://127.0.0.1:$web_port/readyz" >/dev/null 2>&1 && break
        kill -0 "${E2E_PIDS[1]}" 2>/dev/null || { cat "$out/server.log" >&2; die "the server exited during start-up"; }
        sleep 0.2
    done
    curl -fsS "http://127.0.0.1:$web_port/readyz" >/dev/null || { cat "$out/server.log" >&2; die "the server never became ready"; }
    local token
    token=$(DATABASE_URL="$db_url" REDIS_URL="redis://127.0.0.1:$redis_port" HOLDFAST_LOG=warn \
        "$CARGO_TARGET_DIR/debug/holdfast" token create --name e2e --scopes checkout,read 2>/dev/null | sed -n 2p)
    [ -n "$token" ] || die "could not create an API token for the browser tests"
    # The demo's users (admin, support, viewer) sign in with the demo password;
    # HOLDFAST_BIN lets a test take a lock through the CLI.
    (cd end2end && HOLDFAST_BASE_URL="http://127.0.0.1:$web_port" HOLDFAST_TOKEN="$token" \
        HOLDFAST_BIN="$CARGO_TARGET_DIR/debug/holdfast" DATABASE_URL="$db_url" \
        REDIS_URL="redis://127.0.0.1:$redis_port" HOLDFAST_DEMO_PASSWORD=holdfast-demo \
        npx playwright test)
}

prepare
ensure_e2e_tools
command -v curl >/dev/null || apt_install curl

say "checking formatting"
cargo fmt --all --check
say "checking that only the engine talks to Redis and PostgreSQL"
"$HOLDFAST_ROOT/scripts/check-boundaries.sh"
say "supply chain: licences, crate sources, bans (cargo deny)"
ensure_cargo_deny
cargo deny --log-level error check licenses bans sources
# The RustSec database is a git repository on GitHub, kept by cargo-deny under
# ~/.cargo/advisory-dbs: refreshed when GitHub answers (the fetch also "succeeds"
# when it cannot reach GitHub and a copy exists, so the copy's own date is what
# the run reports); with no copy at all, said loudly (never silently passed).
ADVISORY_DB="$HOME/.cargo/advisory-dbs/advisory-db-3157b0e258782691"
timeout 120 cargo deny --log-level error fetch db >/dev/null 2>&1 || true
if [ -d "$ADVISORY_DB/crates" ]; then
    say "supply chain: RustSec advisories (cargo deny; database as of $(git -C "$ADVISORY_DB" log -1 --format=%cd --date=short 2>/dev/null || echo 'an unknown date'))"
    cargo deny --offline --log-level error check advisories
else
    say "NOTICE: the RustSec advisory database could not be fetched from this machine and no local copy exists; advisories were NOT checked in this run"
fi

say "alert rules (promtool)"
command -v promtool >/dev/null || apt_install prometheus
promtool check rules docs/operations/prometheus-rules.yml

say "lints (clippy, warnings are errors)"
cargo clippy --workspace --exclude holdfast-frontend --all-targets -- -D warnings
cargo clippy -p holdfast-frontend --target wasm32-unknown-unknown -- -D warnings

say "unit and integration tests (Redis: $REDIS_URL)"
# The fault suite runs next, on its own, so its figures are printed.
cargo test --workspace --exclude holdfast-frontend -- --skip the_fault_suite
HOLDFAST_PREPARED=1 "$HOLDFAST_ROOT/scripts/chaos.sh"

# Built after the tests so the browser tests run the binary cargo-leptos made
# together with the WASM bundle.
build_site

say "end-to-end tests in headless Chromium"
run_e2e
