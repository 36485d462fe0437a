#!/usr/bin/env bash
# Two bench binaries draining the same workload in alternating pairs, on a database each
# (they may differ in schema: bench/no-rule.patch drops an index), and the ratio of their
# medians. For what a change costs the Worker's drain (bench/notes/2026-12-03-one-run-per-key.md).
#
#   bench/pairs.sh DIALECT ROUNDS A_BIN B_BIN
#   bench/pairs.sh postgres 10 /tmp/bench-this /tmp/bench-no-rule
#
# Databases: task_dedup_pair_a and task_dedup_pair_b on the servers of bench/run.sh
# (created if missing), /tmp/task_dedup_pair_{a,b}.db for SQLite. Each run: 10,000
# no-op tasks, 4 Workers x 8, pool of 16 (BENCH_OPS, BENCH_WORKERS, BENCH_CONCURRENCY).
# BENCH_WORKLOAD=unique: creates instead (find-or-enqueue, 16 clients), e.g. an index's
# write cost with B_BIN a wrapper that sets BENCH_DROP_INDEX=<index> (bench/src/run.rs).
# BENCH_SQL='<statements; separated by ;>' runs them after the migrations (a schema change
# tried before it becomes a migration, e.g. an index added or dropped, against the same binary).
set -euo pipefail
dialect=$1 rounds=$2 a_bin=$3 b_bin=$4
ops=${BENCH_OPS:-10000} workers=${BENCH_WORKERS:-4} concurrency=${BENCH_CONCURRENCY:-8}
url() {
  case $dialect in
    postgres)
      psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE task_dedup_pair_$1" postgres 2>/dev/null || true
      echo "postgres://postgres@127.0.0.1:5432/task_dedup_pair_$1?sslmode=disable" ;;
    mysql)
      mariadb -h 127.0.0.1 -u root -e "CREATE DATABASE IF NOT EXISTS task_dedup_pair_$1"
      echo "mysql://root@127.0.0.1:3306/task_dedup_pair_$1" ;;
    sqlite) echo "sqlite:///tmp/task_dedup_pair_$1.db?mode=rwc" ;;
    *) echo "unknown dialect $dialect" >&2; exit 1 ;;
  esac
}
a_url=$(url a) b_url=$(url b)
workload=${BENCH_WORKLOAD:-worker}
drain() {
  "$1" --url "$2" --pool 16 --workers "$workers" --concurrency "$concurrency" \
    --strategy find-or-enqueue --workload "$workload" --ops "$ops" | sed -n 1p | cut -d' ' -f5
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
a="" b=""
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then
    a="$a $(drain "$a_bin" "$a_url")" b="$b $(drain "$b_bin" "$b_url")"
  else
    b="$b $(drain "$b_bin" "$b_url")" a="$a $(drain "$a_bin" "$a_url")"
  fi
done
am=$(median <<<"$a") bm=$(median <<<"$b")
echo "$dialect tasks/s: A $am (runs:$a), B $bm (runs:$b), A / B $(awk -v a="$am" -v b="$bm" 'BEGIN {printf "%.3f", a / b}')"
