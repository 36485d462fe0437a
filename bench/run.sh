#!/usr/bin/env bash
# Runs the benchmark matrix: every strategy x workload, on SQLite (WAL file), PostgreSQL
# and MariaDB/MySQL, at 1, 16 and 64 clients on a pool of 16, then prints one table with
# each strategy's throughput as a ratio to raw-dedup on the same dialect, workload and
# client count (measured in the same run of this script).
#
#   bench/run.sh                       # everything (about 20 minutes on 2 cores)
#   BENCH_DIALECTS="postgres" BENCH_CLIENTS="16" bench/run.sh
#
# Environment (defaults fit the development machine):
#   BENCH_SQLITE_URL    sqlite:///tmp/task-dedup-bench.db?mode=rwc
#   BENCH_POSTGRES_URL  postgres://postgres@127.0.0.1:5432/task_dedup_bench?sslmode=disable
#   BENCH_MYSQL_URL     mysql://root@127.0.0.1:3306/task_dedup_bench
#   BENCH_DIALECTS      "sqlite postgres mysql"     BENCH_CLIENTS  "1 16 64"
#   BENCH_WORKLOADS     "unique dup churn race replace"   BENCH_POOL  16
#   BENCH_STRATEGIES    all six                     BENCH_OPS      10000
#   BENCH_REPEAT        1: runs of each cell; the table shows medians (worst case for
#                       duplicates and errors), strategies interleaved within a repeat
#   BENCH_DEADLINE      60: seconds after which a warm-up or a run stops by itself
#   BENCH_BATCH         100: tasks per call of the bulk and bulk-mixed workloads (whose
#                       ops/s count tasks), e.g. BENCH_WORKLOADS="unique bulk bulk-mixed"
#   BENCH_BASE_BIN      a binary of another commit (e.g. main): a strategy written
#                       base:<strategy> in BENCH_STRATEGIES runs with it, in the same run
#                       (interleaved like the others), and shows as base:<strategy>
# The bench drops and recreates task-dedup's tables in those databases; the PostgreSQL
# and MySQL databases must exist (createdb task_dedup_bench / CREATE DATABASE ...).
# Raw results go to bench/results/<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

sqlite_url=${BENCH_SQLITE_URL:-"sqlite:///tmp/task-dedup-bench.db?mode=rwc"}
postgres_url=${BENCH_POSTGRES_URL:-"postgres://postgres@127.0.0.1:5432/task_dedup_bench?sslmode=disable"}
mysql_url=${BENCH_MYSQL_URL:-"mysql://root@127.0.0.1:3306/task_dedup_bench"}
dialects=${BENCH_DIALECTS:-"sqlite postgres mysql"}
clients_list=${BENCH_CLIENTS:-"1 16 64"}
workloads=${BENCH_WORKLOADS:-"unique dup churn race replace"}
strategies=${BENCH_STRATEGIES:-"raw-dedup find-or-enqueue raw-one-statement raw-insert naive serializable advisory-lock"}
pool=${BENCH_POOL:-16}
ops=${BENCH_OPS:-10000}
repeat=${BENCH_REPEAT:-1}
deadline=${BENCH_DEADLINE:-60}
batch=${BENCH_BATCH:-100}

# BENCH_BIN: a binary built before (e.g. of another commit, to compare two in one session).
bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --release -p task-dedup-bench
  bin=${CARGO_TARGET_DIR:-target}/release/task-dedup-bench
fi
mkdir -p bench/results
results="bench/results/$(date -u +%Y%m%dT%H%M%SZ).txt"
{
  echo "# $(date -u) $(uname -srm), $(nproc) cpus; pool=$pool ops=$ops repeat=$repeat batch=$batch"
  echo "# dialect clients strategy workload ops seconds ops_per_sec duplicates_active active_jobs created errors | p50_us p99_us cpu_us_per_call abandoned churn_duplicates"
} >"$results"

for dialect in $dialects; do
  case $dialect in
    sqlite) url=$sqlite_url ;;
    postgres) url=$postgres_url ;;
    mysql) url=$mysql_url ;;
    *) echo "unknown dialect $dialect" >&2; exit 1 ;;
  esac
  for workload in $workloads; do
    for clients in $clients_list; do
      for _ in $(seq "$repeat"); do
      for strategy in $strategies; do
        run_bin=$bin label=
        case $strategy in
          base:*)
            run_bin=${BENCH_BASE_BIN:?"$strategy needs BENCH_BASE_BIN"} label=base:
            strategy=${strategy#base:} ;;
        esac
        case $strategy in advisory-lock | raw-one-statement) [ "$dialect" != postgres ] && continue ;; esac
        # Latest payload wins: the library against the hand-written upsert only.
        [ "$workload" = replace ] && [ "$strategy" != raw-dedup ] && [ "$strategy" != find-or-enqueue ] && continue
        out=$("$run_bin" --url "$url" --strategy "$strategy" --workload "$workload" \
          --clients "$clients" --pool "$pool" --ops "$ops" --batch "$batch" --deadline-secs "$deadline") || {
          echo "$dialect $clients $label$strategy $workload FAILED" | tee -a "$results" >&2
          continue
        }
        line=$label$(sed -n 1p <<<"$out")
        # p50_us p99_us cpu_us_per_call abandoned churn_duplicates (the order of the # line)
        extra=$(sed -n 2p <<<"$out" | tr ' ' '\n' | grep -E '^(p50_us|p99_us|cpu_us_per_call|churn_duplicates|abandoned)=' | cut -d= -f2 | tr '\n' ' ' || true)
        echo "$dialect $clients $line | $extra" | tee -a "$results"
      done
      done
    done
  done
done

echo
echo "Ratios to raw-dedup (same dialect, workload, clients; medians of $repeat run(s)); raw results in $results"
awk '
  function median(list,   n, v, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > t + 0; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  /^#/ || /FAILED/ { next }
  {
    cell = $1 " " $4 " " $2 " " $3
    if (!(cell in seen)) { seen[cell] = 1; order[++cells] = cell }
    rate[cell] = rate[cell] " " $7; p50[cell] = p50[cell] " " $13
    p99[cell] = p99[cell] " " $14; cpu[cell] = cpu[cell] " " $15
    # duplicates left active, plus those the churn finisher completed
    if ($8 + $17 > dup[cell]) dup[cell] = $8 + $17
    if ($11 > err[cell]) err[cell] = $11
    if ($16 > gone[cell]) gone[cell] = $16
  }
  END {
    printf "%-8s %-8s %7s  %-16s %9s %6s %8s %8s %8s %7s %6s %9s\n", "dialect", "workload", "clients", "strategy", "ops/s", "ratio", "p50_us", "p99_us", "cpu_us", "dup_act", "errors", "abandoned"
    for (i = 1; i <= cells; i++) {
      split(order[i], k, " ")
      base = k[1] " " k[2] " " k[3] " raw-dedup"
      r = median(rate[order[i]])
      ratio = (base in rate) ? sprintf("%.2f", r / median(rate[base])) : "-"
      printf "%-8s %-8s %7s  %-16s %9.0f %6s %8.0f %8.0f %8.1f %7d %6d %9d\n", k[1], k[2], k[3], k[4], r, ratio, median(p50[order[i]]), median(p99[order[i]]), median(cpu[order[i]]), dup[order[i]], err[order[i]], gone[order[i]]
    }
  }' "$results"
