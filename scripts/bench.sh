#!/usr/bin/env bash
# Reruns every benchmark in release mode and prints the results as Markdown, with
# the machine they ran on, for BENCHMARKS.md. Also saved to bench/output/latest.md,
# with the drop rehearsal's plot (bench/output/drop.svg) and report (drop.json).
# Each benchmark starts its own redis-server; PostgreSQL is reused or started as
# for the other scripts. Run it on an otherwise idle machine. The badge benchmark
# opens 50,000 sockets in each of two processes: the open-files limit is raised as
# far as the hard limit allows (below 51,000, fewer connections, as the output says).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_service_binaries
ensure_postgres
command -v redis-benchmark >/dev/null || apt_install redis-tools
command -v wrk >/dev/null || apt_install wrk
command -v perf >/dev/null || apt_install linux-perf

# 50,000 badge connections need an open-files limit above that in both the
# benchmark and the server (each its own process); raised as far as allowed, and
# the badge benchmark opens as many as the limit leaves room for.
ulimit -Hn 110000 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
badges=$(( $(ulimit -n) - 1000 ))
[ "$badges" -le 50000 ] || badges=50000
[ "$badges" -ge 10000 ] || die "raise the open-files limit to at least 11000 (ulimit -n); 51000 for the whole badge benchmark"
out="$HOLDFAST_ROOT/bench/output"
mkdir -p "$out"
say "building the benchmarks and the server (release)"
cargo build --release -p holdfast-engine --examples
cargo build --release -p holdfast-cli --bin holdfast --examples

run() {
    say "$*"
    "$CARGO_TARGET_DIR/release/examples/$@"
}

# Runs a benchmark with its load generator (the benchmark process, and wrk,
# redis-benchmark or `holdfast simulate` it starts) on the last core and the
# stack it measures (server, Redis, PostgreSQL) on the others, so the figures
# show what the stack does without the generator's share of the CPU.
all_cores="0-$(( $(nproc) - 1 ))"
service_cores="0-$(( $(nproc) - 2 ))"
generator_core="$(( $(nproc) - 1 ))"
pin_postgres() {
    local p
    for p in $(pgrep -x postgres); do taskset -a -p -c "$1" "$p" >/dev/null; done
}
run_split() {
    say "$* (load generator on core $generator_core, the stack on $service_cores)"
    local status=0
    pin_postgres "$service_cores"
    HOLDFAST_BENCH_SERVICE_CPUS="$service_cores" \
        taskset -c "$generator_core" "$CARGO_TARGET_DIR/release/examples/$@" || status=$?
    pin_postgres "$all_cores"
    return $status
}

{
    echo "## Run of $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB;" \
        "$(redis-server --version | cut -d' ' -f1-3), PostgreSQL $(psql --version | awk '{print $3}'), $(rustc --version | cut -d' ' -f1-2)."
    echo
    echo "### Reserve through the HTTP API vs raw EVALSHA (one hot SKU)"
    echo
    run http_vs_evalsha --clients 50 --seconds 5 --profile 1
    echo
    echo "### The Redis path vs PostgreSQL SELECT ... FOR UPDATE (one hot row)"
    echo
    run pg_baseline --clients 100 --seconds 5
    echo
    echo "### The worked example: 2,000 units, 160,000 shoppers at 8,000/s"
    echo
    run drop_rehearsal --out "$out"
    echo
    echo "The same step with 1,000 connections per server opened before it:"
    echo
    run drop_rehearsal --out "$out/preopened" --connections 1000
    echo
    echo "### Rejections after a sell-out: sold-out cache vs Redis"
    echo
    run soldout_bench --clients 50 --seconds 5
    echo
    echo "### Reserve: engine vs raw EVALSHA of reserve.lua (one hot SKU)"
    echo
    for clients in 50 100; do
        run reserve_bench --clients "$clients" --seconds 5
        echo
    done
    echo "### One hot SKU split into parts"
    echo
    run split_bench --clients 50 --seconds 5 --units 20000
    echo
    echo "### System of record"
    echo
    for skus in 100000 1000000; do
        run record_bench --skus "$skus" --sales 20000
        echo
    done
    echo "### Checkout through HTTP, alone and during a bulk feed"
    echo
    run checkout_bench --rate 2000 --seconds 10
    echo
    run checkout_bench --rate 5000 --seconds 5
    echo
    run checkout_bench --rate 5000 --seconds 5 --pause-feeds 1
    echo
    echo "### The load generator on a core of its own"
    echo
    if [ "$(nproc)" -ge 2 ]; then
        echo "The same benchmarks with the load generator pinned to core $generator_core and the server, Redis and PostgreSQL to cores $service_cores (\`taskset\`):"
        echo
        run_split http_vs_evalsha --clients 50 --seconds 5
        echo
        run_split checkout_bench --rate 5000 --seconds 5
        echo
        run_split drop_rehearsal --out "$out/split" --connections 1000
        echo
    else
        echo "One core: nothing to split."
        echo
    fi
    echo "### Shopper badges"
    echo
    [ "$badges" -eq 50000 ] || echo "The open-files limit here is $(ulimit -n) (hard limit $(ulimit -Hn)): $badges connections, not 50,000."
    echo
    run badge_bench --connections "$badges"
    echo
    echo "### Running at scale: one node vs a cluster, replica acknowledgements, failover"
    echo
    run cluster_bench --clients 50 --seconds 5 --skus 1000
} | tee "$out/latest.md"
# The plot BENCHMARKS.md shows is the one this run drew.
mkdir -p "$HOLDFAST_ROOT/docs/benchmarks"
cp "$out/drop.svg" "$HOLDFAST_ROOT/docs/benchmarks/drop.svg"
say "results in bench/output/latest.md; plot copied to docs/benchmarks/drop.svg"
