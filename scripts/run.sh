#!/usr/bin/env bash
# Runs Holdfast locally with the demo drop: installs what is missing, starts or
# reuses Redis and PostgreSQL, builds, and serves at http://127.0.0.1:3000.
# Extra arguments go to `holdfast serve` (see `holdfast serve --help`).
#
# `scripts/run.sh --release` builds and runs the self-contained release binary
# instead: optimised, with the dashboard and widget embedded in it, so
# `target/release/holdfast` (under the build directory) can be copied anywhere
# and run there (see docs/deploy/).
#
# HOLDFAST_DEMO_SIMULATE=true also starts a gentle drop rehearsal (`holdfast
# simulate`, a few minutes of shoppers at a dozen a second) once the server is
# ready, so the dashboard has something to show; its report goes to
# .data/simulate.log.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mode=debug
if [ "${1:-}" = --release ]; then
    mode=release
    shift
fi
prepare
build_site "$mode"
export HOLDFAST_DEMO="${HOLDFAST_DEMO:-true}"
export LEPTOS_SITE_ROOT="${LEPTOS_SITE_ROOT:-$HOLDFAST_ROOT/target/site}"
bin="$CARGO_TARGET_DIR/$mode/holdfast"
[ "$mode" = release ] && say "the self-contained binary is $bin"

case "${HOLDFAST_DEMO_SIMULATE:-false}" in
    1|true|yes|on) ;;
    *)
        say "starting Holdfast"
        exec "$bin" serve "$@"
        ;;
esac

command -v curl >/dev/null || apt_install curl
say "starting Holdfast, then a gentle drop rehearsal"
"$bin" serve "$@" &
server=$!
trap 'kill "$server" 2>/dev/null || true' INT TERM EXIT
listen="${HOLDFAST_LISTEN:-127.0.0.1:3000}"
for _ in $(seq 150); do
    curl -fsS "http://$listen/readyz" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || die "the server exited during start-up"
    sleep 0.2
done
mkdir -p "$DATA_DIR"
say "rehearsal running: watch http://$listen/?drop=rehearsal (report in .data/simulate.log)"
"$bin" simulate --url "http://$listen" --shoppers 3000 --units 600 --peak-rps 12 \
    --peak-secs 90 --decay-secs 120 --hold-ttl-secs 30 --think-ms 20000 \
    >"$DATA_DIR/simulate.log" 2>&1 &
wait "$server"
