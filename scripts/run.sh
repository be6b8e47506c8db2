#!/usr/bin/env bash
# Runs Holdfast locally with the demo drop: installs what is missing, starts or
# reuses Redis and PostgreSQL, builds, and serves at http://127.0.0.1:3000.
# Extra arguments go to `holdfast serve` (see `holdfast serve --help`).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prepare
build_site
export HOLDFAST_DEMO="${HOLDFAST_DEMO:-true}"
export LEPTOS_SITE_ROOT="${LEPTOS_SITE_ROOT:-$HOLDFAST_ROOT/target/site}"
say "starting Holdfast"
exec "$CARGO_TARGET_DIR/debug/holdfast" serve "$@"
