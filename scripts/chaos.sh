#!/usr/bin/env bash
# The fault suite: a sale through the HTTP API of a real `holdfast serve` while
# the server is killed with SIGKILL mid write-behind, PostgreSQL stops for a
# minute (CHAOS_PG_DOWN_SECS, default 60), Redis is killed and restarted empty (the
# server notices and warms it again by itself), feeds lower stock under open holds, carts over shards race the
# reaper, and a reconciliation is SIGSTOPped while it holds its lock and resumed
# after its lease (its stale fencing token must be refused). After each fault
# `holdfast verify` must pass; the figures (units sold vs stock, acknowledged
# confirms lost, time to recover, p99 before and during the outage) are printed. Every service it kills is its own, on free ports.
# Run by scripts/test.sh; on its own it prepares the machine the same way.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "${HOLDFAST_PREPARED:-}" = 1 ] || prepare
say "fault suite (PostgreSQL down for ${CHAOS_PG_DOWN_SECS:-60} s)"
cargo test -p holdfast-cli --test chaos -- --nocapture --test-threads 1
