# Shared preparation for scripts/run.sh and scripts/test.sh. Sourced, not run.
#
# Installs what is missing, reuses Redis and PostgreSQL when REDIS_URL and
# DATABASE_URL answer, otherwise starts private ones on loopback with their data
# under .data/ (git-ignored), and makes sure the database exists. Every step is
# idempotent: a second run reinstalls and rebuilds nothing that is current.

set -euo pipefail

HOLDFAST_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HOLDFAST_ROOT"

export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
# Builds live outside the clone so a fresh clone (CI) reuses them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOLDFAST_TARGET_DIR:-$HOME/.cache/holdfast/target}}"
DATA_DIR="$HOLDFAST_ROOT/.data"
CARGO_LEPTOS_VERSION="0.3.10"
CARGO_DENY_VERSION="0.20.2"
PRIVATE_REDIS_PORT="${HOLDFAST_PRIVATE_REDIS_PORT:-6390}"
PRIVATE_PG_PORT="${HOLDFAST_PRIVATE_PG_PORT:-5440}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }

APT_UPDATED=0
# Installs Debian packages when running as root; otherwise says exactly what to install.
apt_install() {
    if ! is_root; then
        die "missing: $*. Install it with: sudo apt-get install -y $*"
    fi
    command -v apt-get >/dev/null || die "missing: $*, and apt-get is not available to install it"
    if [ "$APT_UPDATED" -eq 0 ]; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
        APT_UPDATED=1
    fi
    say "apt-get install $*"
    # Waits for another apt (a fresh machine may be installing at boot)
    # instead of failing on its lock.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
}

ensure_rust_tools() {
    command -v cargo >/dev/null || die "cargo is missing: install Rust with rustup (https://rustup.rs)"
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        say "adding the wasm32-unknown-unknown target"
        rustup target add wasm32-unknown-unknown
    fi
    local want
    want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
    [ -n "$want" ] || die "cannot find wasm-bindgen's version in Cargo.lock"
    if ! wasm-bindgen --version 2>/dev/null | grep -q " $want\$"; then
        # In the background: it compiles while Holdfast does (build_site waits
        # for it), which uses the moments one core idles in either build.
        mkdir -p "$DATA_DIR"
        say "installing wasm-bindgen-cli $want (must match Cargo.lock) in the background while Holdfast compiles (once; about 4 min on 2 cores)"
        # Not --locked: the CLI's own lockfile pins a crate the registry no longer has.
        # Only the `wasm-bindgen` binary, without the TLS its test runner uses to
        # download browsers (no rustls or ring to compile: about a minute less).
        cargo install wasm-bindgen-cli --version "$want" --force --no-default-features \
            --bin wasm-bindgen >"$DATA_DIR/wasm-bindgen-install.log" 2>&1 &
        WASM_BINDGEN_INSTALL=$!
    fi
}

WASM_BINDGEN_INSTALL=""
# Waits for the background wasm-bindgen-cli install, if one is running.
await_wasm_bindgen() {
    [ -n "$WASM_BINDGEN_INSTALL" ] || return 0
    say "waiting for the wasm-bindgen-cli install to finish"
    if ! wait "$WASM_BINDGEN_INSTALL"; then
        tail -n 30 "$DATA_DIR/wasm-bindgen-install.log" >&2
        die "installing wasm-bindgen-cli failed (log: $DATA_DIR/wasm-bindgen-install.log)"
    fi
    WASM_BINDGEN_INSTALL=""
}

# cargo-leptos, only for `cargo leptos watch` while developing (the scripts build
# the site themselves with cargo and wasm-bindgen, which is 20 minutes quicker on
# a fresh machine: cargo-leptos alone takes that long to compile).
ensure_cargo_leptos() {
    if ! cargo leptos --version 2>/dev/null | grep -q "$CARGO_LEPTOS_VERSION"; then
        say "installing cargo-leptos $CARGO_LEPTOS_VERSION (once; about 20 min on 2 cores)"
        cargo install cargo-leptos --locked --version "$CARGO_LEPTOS_VERSION" --features no_downloads
    fi
}

# cargo-deny for the supply-chain checks (scripts/test.sh only).
ensure_cargo_deny() {
    if ! cargo deny --version 2>/dev/null | grep -q "$CARGO_DENY_VERSION"; then
        say "installing cargo-deny $CARGO_DENY_VERSION (a few minutes, once)"
        cargo install cargo-deny --locked --version "$CARGO_DENY_VERSION"
    fi
}

ensure_service_binaries() {
    command -v redis-server >/dev/null || apt_install redis-server
    command -v psql >/dev/null && pg_bin_dir >/dev/null || apt_install postgresql
}

pg_bin_dir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$d" ] && [ -x "$d/initdb" ] || return 1
    echo "$d"
}

redis_answers() { redis-cli -u "$1" ping 2>/dev/null | grep -q PONG; }

ensure_redis() {
    local url="${REDIS_URL:-redis://127.0.0.1:6379}"
    if redis_answers "$url"; then
        say "using Redis at $url"
    elif [ -n "${REDIS_URL:-}" ]; then
        die "REDIS_URL=$REDIS_URL does not answer PING. Start that server, or unset REDIS_URL to let this script start a private one"
    else
        url="redis://127.0.0.1:$PRIVATE_REDIS_PORT"
        if ! redis_answers "$url"; then
            say "starting a private Redis on 127.0.0.1:$PRIVATE_REDIS_PORT (data in .data/redis)"
            mkdir -p "$DATA_DIR/redis"
            redis-server --port "$PRIVATE_REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
                --maxmemory-policy noeviction --dir "$DATA_DIR/redis" --daemonize yes \
                --pidfile "$DATA_DIR/redis/redis.pid" --logfile "$DATA_DIR/redis/redis.log"
            for _ in $(seq 50); do redis_answers "$url" && break; sleep 0.1; done
            redis_answers "$url" || die "the private Redis did not start; see .data/redis/redis.log"
        fi
    fi
    export REDIS_URL="$url"
}

# postgres://user@host:port/db -> the same server's maintenance database URL.
pg_admin_url() { local u="${1%%\?*}"; echo "${u%/*}/postgres"; }
pg_db_name() { local u="${1%%\?*}"; echo "${u##*/}"; }
pg_answers() { psql "$(pg_admin_url "$1")" -tAc 'SELECT 1' >/dev/null 2>&1; }

as_postgres() {
    if is_root; then runuser -u postgres -- "$@"; else "$@"; fi
}

ensure_postgres() {
    local url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/holdfast}"
    if pg_answers "$url"; then
        say "using PostgreSQL at ${url%%@*}@${url#*@}"
    elif [ -n "${DATABASE_URL:-}" ]; then
        die "DATABASE_URL does not answer. Start that server, or unset DATABASE_URL to let this script start a private one"
    else
        url="postgres://postgres@127.0.0.1:$PRIVATE_PG_PORT/holdfast"
        if ! pg_answers "$url"; then
            local bin
            bin=$(pg_bin_dir) || die "PostgreSQL server binaries not found under /usr/lib/postgresql"
            mkdir -p "$DATA_DIR"
            if [ ! -f "$DATA_DIR/pg/PG_VERSION" ]; then
                say "initialising a private PostgreSQL in .data/pg"
                mkdir -p "$DATA_DIR/pg"
                is_root && chown postgres:postgres "$DATA_DIR/pg"
                as_postgres "$bin/initdb" -D "$DATA_DIR/pg" --username=postgres --auth=trust >/dev/null
            fi
            say "starting a private PostgreSQL on 127.0.0.1:$PRIVATE_PG_PORT"
            is_root && chown postgres:postgres "$DATA_DIR/pg"
            as_postgres "$bin/pg_ctl" -D "$DATA_DIR/pg" -l "$DATA_DIR/pg/server.log" -w \
                -o "-p $PRIVATE_PG_PORT -c listen_addresses=127.0.0.1 -k $DATA_DIR/pg" start >/dev/null
            pg_answers "$url" || die "the private PostgreSQL did not start; see .data/pg/server.log"
        fi
    fi
    export DATABASE_URL="$url"
    ensure_database "$url"
}

ensure_database() {
    local url="$1" db
    db=$(pg_db_name "$url")
    if [ "$(psql "$(pg_admin_url "$url")" -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'")" != "1" ]; then
        say "creating database $db"
        psql "$(pg_admin_url "$url")" -qc "CREATE DATABASE \"$db\"" >/dev/null
    fi
}

# Builds the site into target/site the way cargo-leptos lays it out (pkg/holdfast.js,
# pkg/holdfast.wasm, pkg/holdfast.css and the public/ assets), then the server.
# `build_site release` builds the small WASM bundle (profile wasm-release, and
# wasm-opt when it is installed) and a release `holdfast` with the site embedded
# in it (feature embedded-site), so that binary needs no files beside it.
build_site() {
    local mode="${1:-debug}" site="$HOLDFAST_ROOT/target/site" wasm_dir profile_args
    if [ "$mode" = release ]; then
        wasm_dir=wasm-release
        profile_args=(--profile wasm-release)
    else
        wasm_dir=debug
        profile_args=()
    fi
    say "building the dashboard's WASM bundle ($mode; about 5 min the first time on 2 cores)"
    cargo build -p holdfast-frontend --lib --target wasm32-unknown-unknown "${profile_args[@]}"
    if [ "$mode" != release ]; then
        say "building the server (about 10 min the first time on 2 cores, seconds after)"
        cargo build -p holdfast-cli --bin holdfast
    fi
    await_wasm_bindgen
    local staged="$HOLDFAST_ROOT/target/site.new"
    rm -rf "$staged"
    mkdir -p "$staged/pkg"
    wasm-bindgen --target web --no-typescript --out-dir "$staged/pkg" --out-name holdfast \
        "$CARGO_TARGET_DIR/wasm32-unknown-unknown/$wasm_dir/holdfast_frontend.wasm"
    mv "$staged/pkg/holdfast_bg.wasm" "$staged/pkg/holdfast.wasm"
    if [ "$mode" = release ] && command -v wasm-opt >/dev/null; then
        say "shrinking the WASM bundle (wasm-opt -Oz)"
        wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int \
            -o "$staged/pkg/holdfast.wasm" "$staged/pkg/holdfast.wasm"
    fi
    cp style/main.css "$staged/pkg/holdfast.css"
    cp -R public/. "$staged/"
    rm -rf "$site"
    mv "$staged" "$site"
    if [ "$mode" = release ]; then
        # After the site: the release binary embeds it.
        say "building the release server with the site embedded (about 12 min the first time on 2 cores)"
        HOLDFAST_SITE_DIR="$site" cargo build --release -p holdfast-cli --bin holdfast --features embedded-site
    fi
}

prepare() {
    ensure_rust_tools
    ensure_service_binaries
    ensure_redis
    ensure_postgres
}
