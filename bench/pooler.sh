#!/usr/bin/env bash
# task-dedup behind PgBouncer in transaction mode (issue 24) against a direct connection,
# in the same run:
#   1. find_or_enqueue, unique and dup, 16 clients on a pool of 16: direct, direct in
#      PoolerMode::NoPreparedStatements (that mode's cost), through PgBouncer 1.25, and
#      through PgBouncer 1.18 in that mode, interleaved, BENCH_REPEAT times; prints the
#      medians and their ratios to direct;
#   2. enqueue-to-start latency (worker-latency), idle (2 tasks/s, 40 tasks) and under
#      load (800 tasks/s from 8 callers, 4,000 tasks), 4 workers: direct (LISTEN), through
#      the pooler with `auto` wake-ups (the listener finds itself unheard and the workers
#      poll), and through the pooler with the listener on a direct connection
#      (--listen-url).
#
#   eval "$(.ci/pgbouncer.sh start old)"  # PgBouncer 1.25 on :6432, 1.18 on :6433
#   bench/pooler.sh
#
# Environment: BENCH_POSTGRES_URL (direct; default postgres://postgres@127.0.0.1:5432/
# task_dedup_bench?sslmode=disable), BENCH_POOLER_URL (the same database through the
# pooler; default port 6432), BENCH_OLD_POOLER_URL (PgBouncer 1.18; default port 6433,
# empty to leave it out), BENCH_PARTS ("enqueue latency"), BENCH_REPEAT (3), BENCH_OPS
# (10000), BENCH_BIN. Raw results go to bench/results/pooler-<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

direct=${BENCH_POSTGRES_URL:-"postgres://postgres@127.0.0.1:5432/task_dedup_bench?sslmode=disable"}
pooler=${BENCH_POOLER_URL:-"postgres://postgres@127.0.0.1:6432/task_dedup_bench?sslmode=disable"}
# PgBouncer 1.18 (.ci/pgbouncer.sh start old); empty: left out.
old=${BENCH_OLD_POOLER_URL-"postgres://postgres@127.0.0.1:6433/task_dedup_bench?sslmode=disable"}
parts=${BENCH_PARTS:-"enqueue latency"}
repeat=${BENCH_REPEAT:-3}
ops=${BENCH_OPS:-10000}

bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --release -p task-dedup-bench
  bin=${CARGO_TARGET_DIR:-target}/release/task-dedup-bench
fi
mkdir -p bench/results
results="bench/results/pooler-$(date -u +%Y%m%dT%H%M%SZ).txt"
echo "# $(date -u) $(uname -srm), $(nproc) cpus; ops=$ops repeat=$repeat" | tee "$results"

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

if [[ " $parts " == *" enqueue "* ]]; then
  # direct-np: the direct connection in PoolerMode::NoPreparedStatements (its cost);
  # old: PgBouncer 1.18 in that mode (it has no other), its schema and check direct.
  vias="direct direct-np pooler"
  [ -n "$old" ] && vias="$vias old"
  for workload in unique dup; do
    declare -A rates=()
    for _ in $(seq "$repeat"); do
      for via in $vias; do
        extra=()
        case $via in
          direct) url=$direct ;;
          direct-np) url=$direct extra=(--no-prepared-statements) ;;
          pooler) url=$pooler ;;
          old) url=$old extra=(--no-prepared-statements --direct-url "$direct") ;;
        esac
        line=$("$bin" --url "$url" "${extra[@]}" --pool 16 --clients 16 --strategy find-or-enqueue \
          --workload "$workload" --ops "$ops" | sed -n 1p)
        echo "$via $line" >>"$results"
        rates[$via]="${rates[$via]:-} $(awk '{print $5}' <<<"$line")"
      done
    done
    dm=$(median <<<"${rates[direct]}")
    summary="find_or_enqueue $workload, 16 clients, calls/s (median of $repeat):"
    for via in $vias; do
      m=$(median <<<"${rates[$via]}")
      summary="$summary $via $m (runs:${rates[$via]}, / direct $(awk -v a="$m" -v b="$dm" 'BEGIN {printf "%.2f", a / b}'));"
    done
    echo "$summary" | tee -a "$results"
    unset rates
  done
fi

if [[ " $parts " == *" latency "* ]]; then
  common=(--pool 16 --workers 4 --concurrency 8 --strategy find-or-enqueue --workload worker-latency --wakeups auto)
  for load in "idle --rate 2 --clients 1 --ops 40" "load --rate 800 --clients 8 --ops 4000"; do
    read -r label rest <<<"$load"
    # shellcheck disable=SC2206
    rest=($rest)
    "$bin" --url "$direct" "${common[@]}" "${rest[@]}" | sed "s/^/$label, direct: /" | tee -a "$results"
    "$bin" --url "$pooler" "${common[@]}" "${rest[@]}" | sed "s/^/$label, PgBouncer, polling: /" | tee -a "$results"
    "$bin" --url "$pooler" --listen-url "$direct" "${common[@]}" "${rest[@]}" |
      sed "s/^/$label, PgBouncer, direct listener: /" | tee -a "$results"
  done
fi
echo "raw results in $results"
