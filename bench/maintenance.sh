#!/usr/bin/env bash
# Issue 22's figures: what retention costs.
#
#   bench/maintenance.sh            # both parts
#   MAINT_PARTS="prune" bench/maintenance.sh
#
# Part `history`: creates (`unique`, find-or-enqueue, 16 clients, pool 16) on an empty
#   table, against the same with MAINT_HISTORY finished rows preloaded (finished within
#   the last day: the default retention keeps them) and a pruner running beside the
#   callers every second, interleaved, MAINT_REPEAT times, on PostgreSQL and MariaDB.
# Part `prune`: the pruner alone on MAINT_PRUNE_ROWS expired rows (default batches of
#   1,000), on the three dialects, MAINT_REPEAT times: its time per 10,000 rows.
#
# Environment: BENCH_SQLITE_URL, BENCH_POSTGRES_URL, BENCH_MYSQL_URL (as bench/run.sh),
# MAINT_HISTORY (2000000), MAINT_PRUNE_ROWS (200000), MAINT_OPS (20000), MAINT_REPEAT (3),
# MAINT_DIALECTS ("postgres mysql" for history; prune adds sqlite), BENCH_BIN.
# Raw lines go to bench/results/maintenance-<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

sqlite_url=${BENCH_SQLITE_URL:-"sqlite:///tmp/task-dedup-bench-maint.db?mode=rwc"}
postgres_url=${BENCH_POSTGRES_URL:-"postgres://postgres@127.0.0.1:5432/task_dedup_bench?sslmode=disable"}
mysql_url=${BENCH_MYSQL_URL:-"mysql://root@127.0.0.1:3306/task_dedup_bench"}
parts=${MAINT_PARTS:-"history prune"}
history=${MAINT_HISTORY:-2000000}
prune_rows=${MAINT_PRUNE_ROWS:-200000}
ops=${MAINT_OPS:-20000}
repeat=${MAINT_REPEAT:-3}
dialects=${MAINT_DIALECTS:-"postgres mysql"}

bin=${BENCH_BIN:-}
if [ -z "$bin" ]; then
  cargo build --quiet --release -p task-dedup-bench
  bin=${CARGO_TARGET_DIR:-target}/release/task-dedup-bench
fi
mkdir -p bench/results
results="bench/results/maintenance-$(date -u +%Y%m%dT%H%M%SZ).txt"
echo "# $(date -u) $(uname -srm), $(nproc) cpus; history=$history prune_rows=$prune_rows ops=$ops repeat=$repeat" | tee "$results"

url_of() {
  case $1 in
    sqlite) echo "$sqlite_url" ;;
    postgres) echo "$postgres_url" ;;
    mysql) echo "$mysql_url" ;;
  esac
}

if [[ " $parts " == *" history "* ]]; then
  for dialect in $dialects; do
    url=$(url_of "$dialect")
    for r in $(seq "$repeat"); do
      for h in 0 "$history"; do
        line=$("$bin" --url "$url" --workload unique --strategy find-or-enqueue \
          --clients 16 --pool 16 --ops "$ops" --warmup 2000 --deadline-secs 120 \
          --history "$h" | tr '\n' ' ')
        echo "$dialect history=$h repeat=$r $line" | tee -a "$results"
      done
    done
  done
  echo "# creates/s with history / empty, per repeat and median:" | tee -a "$results"
  awk '$1 !~ /^#/ && $2 ~ /^history=/ {
         split($2, h, "="); split($3, rep, "=");
         rate[$1, rep[2], (h[2] == 0 ? "empty" : "history")] = $8; dialects[$1] = 1; reps[rep[2]] = 1 }
       END { for (d in dialects) { n = 0; line = "";
               for (k = 1; k in reps; k++) if (rate[d, k, "empty"] > 0) {
                 x = rate[d, k, "history"] / rate[d, k, "empty"]; v[++n] = x;
                 line = line sprintf(" %.3f", x) }
               asort(v); m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2;
               printf "%s ratios%s median %.3f\n", d, line, m; delete v } }' "$results" | tee -a "$results"
fi

if [[ " $parts " == *" prune "* ]]; then
  for dialect in sqlite $dialects; do
    url=$(url_of "$dialect")
    for r in $(seq "$repeat"); do
      line=$("$bin" --url "$url" --workload prune --strategy find-or-enqueue --history "$prune_rows")
      echo "$dialect repeat=$r $line" | tee -a "$results"
    done
  done
fi
