#!/usr/bin/env bash
# The worker benchmarks, on each dialect:
#   1. throughput: --ops no-op tasks drained by the library's Worker (find-or-enqueue), by
#      a Worker with a registered typed handler (typed) and by hand-written
#      claim/complete loops on sqlx (raw-dedup), interleaved, BENCH_REPEAT times; prints
#      the medians and their ratios;
#   2. enqueue-to-start latency at an idle rate and under load, Auto wake-ups and polling;
#   3. statements per second of idle workers, Auto wake-ups and polling;
#   4. head-of-line blocking: claim latency of 1,000 free tasks behind BENCH_BLOCKED
#      (10,000) follow-ups whose keys run, against the free tasks alone.
#
#   bench/worker.sh                           # everything (about 15 minutes on 2 cores)
#   BENCH_DIALECTS="postgres" BENCH_PARTS="latency idle" bench/worker.sh
#
# Environment: the BENCH_*_URL variables of bench/run.sh, BENCH_DIALECTS, BENCH_PARTS
# ("throughput latency idle blocked"), BENCH_REPEAT (5), BENCH_OPS (10000), BENCH_WORKERS (4),
# BENCH_CONCURRENCY (8), BENCH_POOL (16), BENCH_IDLE_RATE (2 tasks/s, 40 tasks),
# BENCH_LOAD_RATE (per dialect: "sqlite=800 postgres=800 mysql=500" tasks/s, 4,000 tasks),
# BENCH_IDLE_SECS (20), BENCH_BASE_BIN (a binary of another commit: its Worker drains too,
# interleaved in the same throughput runs, and the ratio to it is printed). Raw results go
# to bench/results/worker-<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

sqlite_url=${BENCH_SQLITE_URL:-"sqlite:///tmp/task-dedup-bench.db?mode=rwc"}
postgres_url=${BENCH_POSTGRES_URL:-"postgres://postgres@127.0.0.1:5432/task_dedup_bench?sslmode=disable"}
mysql_url=${BENCH_MYSQL_URL:-"mysql://root@127.0.0.1:3306/task_dedup_bench"}
dialects=${BENCH_DIALECTS:-"sqlite postgres mysql"}
parts=${BENCH_PARTS:-"throughput latency idle blocked"}
repeat=${BENCH_REPEAT:-5}
ops=${BENCH_OPS:-10000}
workers=${BENCH_WORKERS:-4}
concurrency=${BENCH_CONCURRENCY:-8}
pool=${BENCH_POOL:-16}
idle_rate=${BENCH_IDLE_RATE:-2}
load_rates=${BENCH_LOAD_RATE:-"sqlite=800 postgres=800 mysql=500"}
idle_secs=${BENCH_IDLE_SECS:-20}
blocked=${BENCH_BLOCKED:-10000}

# BENCH_BIN: a binary built before (e.g. of another commit, to compare two in one session).
base_bin=${BENCH_BASE_BIN:-}
bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --release -p task-dedup-bench
  bin=${CARGO_TARGET_DIR:-target}/release/task-dedup-bench
fi
mkdir -p bench/results
results="bench/results/worker-$(date -u +%Y%m%dT%H%M%SZ).txt"
echo "# $(date -u) $(uname -srm), $(nproc) cpus; ops=$ops workers=$workers concurrency=$concurrency pool=$pool repeat=$repeat" | tee "$results"

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

for dialect in $dialects; do
  case $dialect in
    sqlite) url=$sqlite_url ;;
    postgres) url=$postgres_url ;;
    mysql) url=$mysql_url ;;
    *) echo "unknown dialect $dialect" >&2; exit 1 ;;
  esac
  common=(--url "$url" --pool "$pool" --workers "$workers" --concurrency "$concurrency")
  if [[ " $parts " == *" throughput "* ]]; then
    lib="" raw="" base="" typed=""
    runs="find-or-enqueue typed raw-dedup"
    if [ -n "$base_bin" ]; then runs="$runs base"; fi
    for _ in $(seq "$repeat"); do
      for strategy in $runs; do
        if [ "$strategy" = base ]; then
          line=$("$base_bin" "${common[@]}" --strategy find-or-enqueue --workload worker --ops "$ops" | sed -n 1p)
          echo "$dialect throughput base $line" >>"$results"
        else
          line=$("$bin" "${common[@]}" --strategy "$strategy" --workload worker --ops "$ops" | sed -n 1p)
          echo "$dialect throughput $line" >>"$results"
        fi
        rate=$(cut -d' ' -f5 <<<"$line")
        case $strategy in
          find-or-enqueue) lib="$lib $rate" ;;
          typed) typed="$typed $rate" ;;
          raw-dedup) raw="$raw $rate" ;;
          base) base="$base $rate" ;;
        esac
      done
    done
    lib_m=$(median <<<"$lib") raw_m=$(median <<<"$raw")
    echo "$dialect throughput tasks/s: Worker $lib_m (runs:$lib), hand-written loop $raw_m (runs:$raw), ratio $(awk -v a="$lib_m" -v b="$raw_m" 'BEGIN {printf "%.2f", a / b}')" | tee -a "$results"
    typed_m=$(median <<<"$typed")
    echo "$dialect throughput tasks/s: typed Worker $typed_m (runs:$typed), typed / untyped Worker $(awk -v a="$typed_m" -v b="$lib_m" 'BEGIN {printf "%.2f", a / b}')" | tee -a "$results"
    if [ -n "$base_bin" ]; then
      base_m=$(median <<<"$base")
      echo "$dialect throughput tasks/s: base Worker $base_m (runs:$base), ratio to the hand-written loop $(awk -v a="$base_m" -v b="$raw_m" 'BEGIN {printf "%.2f", a / b}'), this Worker / base $(awk -v a="$lib_m" -v b="$base_m" 'BEGIN {printf "%.2f", a / b}')" | tee -a "$results"
    fi
  fi
  if [[ " $parts " == *" latency "* ]]; then
    load_rate=$(tr ' ' '\n' <<<"$load_rates" | sed -n "s/^$dialect=//p")
    for wakeups in auto poll; do
      "$bin" "${common[@]}" --strategy find-or-enqueue --workload worker-latency --wakeups "$wakeups" \
        --rate "$idle_rate" --clients 1 --ops 40 | sed 's/^/idle: /' | tee -a "$results"
      "$bin" "${common[@]}" --strategy find-or-enqueue --workload worker-latency --wakeups "$wakeups" \
        --rate "$idle_rate" --clients 1 --ops 40 --in-transaction | sed 's/^/idle, in a transaction: /' | tee -a "$results"
      "$bin" "${common[@]}" --strategy find-or-enqueue --workload worker-latency --wakeups "$wakeups" \
        --rate "$load_rate" --clients 8 --ops 4000 | sed 's/^/load: /' | tee -a "$results"
    done
  fi
  if [[ " $parts " == *" idle "* ]]; then
    for wakeups in auto poll; do
      "$bin" "${common[@]}" --strategy find-or-enqueue --workload worker-idle --wakeups "$wakeups" \
        --idle-secs "$idle_secs" | tee -a "$results"
    done
  fi
  if [[ " $parts " == *" blocked "* ]]; then
    "$bin" "${common[@]}" --strategy find-or-enqueue --workload worker-blocked \
      --blocked "$blocked" --ops 1000 | tee -a "$results"
  fi
done
echo "raw results in $results"
