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

# A port below the kernel's ephemeral range (32768 and up here), so an outgoing
# connection cannot take it between this check and the server's bind (a CI run
# once lost its quick start that way).
free_port() {
    local p low
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    for p in $(shuf -i 20000-$((low - 1)) -n 50); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
    done
    die "no free loopback port found"
}

# Starts a private Redis on a free port; its pid joins E2E_PIDS.
E2E_PIDS=()
start_private_redis() {
    local port="$1" log="$2"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --logfile "$log" &
    E2E_PIDS+=($!)
    # Global, not local: the trap runs after the caller has returned.
    trap 'kill "${E2E_PIDS[@]}" 2>/dev/null || true' EXIT
    for _ in $(seq 100); do
        redis_answers "redis://127.0.0.1:$port" && return
        sleep 0.1
    done
    die "the private Redis on port $port did not start (log: $log)"
}

# A fresh database named $1 on the test PostgreSQL; prints its URL.
fresh_database() {
    psql "$(pg_admin_url "$DATABASE_URL")" -qc "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null
    echo "$(pg_admin_url "$DATABASE_URL" | sed 's|/postgres$||')/$1"
}

# Waits until $1/readyz answers while process $2 lives (at most $3 seconds).
await_ready() {
    local url="$1" pid="$2" log="$3" deadline=$((SECONDS + $4))
    until curl -fsS "$url/readyz" >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || { tail -n 40 "$log" >&2; die "it exited before it was ready (log: $log)"; }
        [ "$SECONDS" -lt "$deadline" ] || { tail -n 40 "$log" >&2; die "not ready after $4 s (log: $log)"; }
        sleep 0.5
    done
}

# Checks that $1 serves the site: the page, the WASM bundle and the widget.
check_site() {
    local url="$1" body
    # Read whole, then searched: `curl | grep -q` fails under pipefail when grep
    # stops reading early.
    body=$(curl -fsS "$url/login") && [[ "$body" == *'/pkg/holdfast.js'* ]] \
        || die "$url/login does not load the dashboard's bundle"
    [ "$(curl -fsS -o /dev/null -w '%{content_type}' "$url/pkg/holdfast.wasm")" = application/wasm ] \
        || die "$url/pkg/holdfast.wasm is not served as application/wasm"
    body=$(curl -fsS "$url/widget.js") && [[ "$body" == *'customElements.define'* ]] \
        || die "$url/widget.js is not served"
}

# The README's first command as a newcomer runs it: `scripts/run.sh` builds the
# debug site and serves the demo drop (here on a private Redis, a fresh database
# and a free port); checked from outside, then stopped.
check_quick_start() {
    local out="$HOLDFAST_ROOT/end2end/output" redis_port web_port db_url pid
    mkdir -p "$out"
    redis_port=$(free_port)
    web_port=$(free_port)
    db_url=$(fresh_database holdfast_quickstart)
    start_private_redis "$redis_port" "$out/quickstart-redis.log"
    DATABASE_URL="$db_url" REDIS_URL="redis://127.0.0.1:$redis_port" \
        HOLDFAST_LISTEN="127.0.0.1:$web_port" "$HOLDFAST_ROOT/scripts/run.sh" >"$out/run-sh.log" 2>&1 &
    pid=$!
    E2E_PIDS+=("$pid")
    await_ready "http://127.0.0.1:$web_port" "$pid" "$out/run-sh.log" 1800
    check_site "http://127.0.0.1:$web_port"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

# Starts a private Redis, a fresh database and the self-contained release binary
# with the demo drop, from an empty directory (so every page, bundle and widget
# comes from the binary itself), runs Playwright against it, and stops what it
# started.
run_e2e() {
    local out="$HOLDFAST_ROOT/end2end/output" redis_port web_port db_url empty
    local bin="$CARGO_TARGET_DIR/release/holdfast"
    mkdir -p "$out"
    redis_port=$(free_port)
    web_port=$(free_port)
    db_url=$(fresh_database holdfast_e2e)
    start_private_redis "$redis_port" "$out/redis.log"
    empty=$(mktemp -d)
    (cd "$empty" && unset LEPTOS_SITE_ROOT && DATABASE_URL="$db_url" REDIS_URL="redis://127.0.0.1:$redis_port" \
        HOLDFAST_DEMO=true HOLDFAST_LISTEN="127.0.0.1:$web_port" exec "$bin" serve) >"$out/server.log" 2>&1 &
    E2E_PIDS+=($!)
    await_ready "http://127.0.0.1:$web_port" "${E2E_PIDS[-1]}" "$out/server.log" 60
    grep -q 'serving the site embedded in this binary' "$out/server.log" \
        || die "the release binary does not serve an embedded site (log: $out/server.log)"
    [ -z "$(ls -A "$empty")" ] || die "the server wrote into its working directory: $(ls -A "$empty")"
    check_site "http://127.0.0.1:$web_port"
    # Nothing from disk: a file under target/site where it runs stays unreachable.
    mkdir -p "$empty/target/site" && echo private >"$empty/target/site/notes.txt"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$web_port/notes.txt")" = 404 ] \
        || die "the release binary served a file from its working directory"
    rm -rf "$empty/target"
    # Weak comparison: a proxy that compresses turns the ETag weak; still a 304.
    local etag
    etag=$(curl -fsSI "http://127.0.0.1:$web_port/widget.js" | tr -d '\r' | sed -n 's/^[Ee][Tt][Aa][Gg]: //p')
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H "If-None-Match: W/$etag" "http://127.0.0.1:$web_port/widget.js")" = 304 ] \
        || die "a weak ETag ($etag) did not revalidate /widget.js"
    # An embedded file takes GET and HEAD only: anything else is 405 with Allow.
    local refused
    refused=$(curl -s -o /dev/null -D - -X POST "http://127.0.0.1:$web_port/widget.js" | tr -d '\r')
    [[ "$refused" == *" 405"* && "${refused,,}" == *"allow: get, head"* ]] \
        || die "POST /widget.js was not refused with 405 and Allow: $refused"
    local token
    token=$(DATABASE_URL="$db_url" REDIS_URL="redis://127.0.0.1:$redis_port" HOLDFAST_LOG=warn \
        "$bin" token create --name e2e --scopes checkout,read 2>/dev/null | sed -n 2p)
    [ -n "$token" ] || die "could not create an API token for the browser tests"
    # The demo's users (admin, support, viewer) sign in with the demo password;
    # HOLDFAST_BIN lets a test take a lock through the CLI.
    (cd end2end && HOLDFAST_BASE_URL="http://127.0.0.1:$web_port" HOLDFAST_TOKEN="$token" \
        HOLDFAST_BIN="$bin" DATABASE_URL="$db_url" \
        REDIS_URL="redis://127.0.0.1:$redis_port" HOLDFAST_DEMO_PASSWORD=holdfast-demo \
        npx playwright test)
}

prepare
ensure_e2e_tools
command -v curl >/dev/null || apt_install curl
# libfaketime skews one server's clock in the drop-schedule test.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || apt_install faketime
# HAProxy runs docs/deploy/haproxy.cfg in front of several servers; openssl makes
# the test CA for the TLS tests.
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || apt_install haproxy
command -v openssl >/dev/null || apt_install openssl

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

say "the engine's and the live suites again, each test Redis a Redis Cluster of three masters (slots spread over three processes; cross-slot work refused)"
# Every suite but the replica one (a cluster node cannot be made a plain
# replica); engine/tests/cluster.rs and cli/tests/cluster.rs also start their
# own clusters, with replicas, and fail masters over.
HOLDFAST_TEST_CLUSTER=3 cargo test -p holdfast-engine \
    --test bounds --test carts --test catalog --test cluster --test honesty \
    --test lifecycle --test model --test outage --test record --test reservations \
    --test resilience --test schedule --test split --test split_faults --test split_consistency --test verify --test drop_file \
    --test pacing
# The server's suites for the webhook lanes, the badges and the dashboard's
# live feed, the same way.
HOLDFAST_TEST_CLUSTER=3 cargo test -p holdfast-server --test ingest --test badge --test dashboard
HOLDFAST_PREPARED=1 "$HOLDFAST_ROOT/scripts/chaos.sh"

say "the quick start: scripts/run.sh serves the demo (debug build)"
check_quick_start

say "the self-contained release binary (site embedded)"
build_site release

say "end-to-end tests in headless Chromium, against the release binary run from an empty directory"
run_e2e
