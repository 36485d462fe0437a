#!/usr/bin/env bash
# task-dedup-loco against Loco's own PgQueue and SqliteQueue, same run, same machine
# (examples/loco/examples/queue_bench.rs): perform_later creates and repeats from 16
# clients, the drain of 20,000 no-op jobs with 4 workers, enqueue-to-start latency;
# BENCH_REPEAT (3) alternating rounds, medians and their ratios printed.
#
#   bench/loco.sh
#   BENCH_REPEAT=1 BENCH_JOBS=2000 bench/loco.sh     # a quick look
#
# Environment: BENCH_PG_URL (postgres://postgres@127.0.0.1:5432/loco_bench, created if
# missing), BENCH_JOBS (20000), BENCH_CALLS (8000 per storm), BENCH_LATENCY_JOBS (50),
# BENCH_REPEAT (3). The example application is a workspace of its own: its release
# build goes to CARGO_TARGET_DIR (default examples/loco/target). Output also goes to
# bench/results/loco-<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

pg=${BENCH_PG_URL:-"postgres://postgres@127.0.0.1:5432/loco_bench"}
admin=${pg%/*}/postgres
database=${pg##*/}
database=${database%%\?*}
if [ "$(psql "$admin" -Atqc "SELECT 1 FROM pg_database WHERE datname = '$database'")" != 1 ]; then
  psql "$admin" -qc "CREATE DATABASE $database"
fi
mkdir -p bench/results
out=bench/results/loco-$(date -u +%Y%m%dT%H%M%SZ).txt
(
  cd examples/loco
  BENCH_PG_URL="$pg" cargo run --quiet --release --example queue_bench
) | tee "$out"
echo "results: $out"
