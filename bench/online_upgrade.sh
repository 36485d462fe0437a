#!/usr/bin/env bash
# Issue 33's figures: `migrate up` from the first migration to the last on a live
# task_run (ONLINE_ROWS rows, 16 clients enqueueing and a worker draining throughout),
# online (`up_online`) against the migrations as they are (blocking), on PostgreSQL and
# MariaDB; and on SQLite the build time of each step (no concurrent writers).
#
#   bench/online_upgrade.sh
#   ONLINE_ROWS=1000000 ONLINE_DIALECTS=postgres ONLINE_MODES=online bench/online_upgrade.sh
#   ONLINE_START=legacy bench/online_upgrade.sh    # the compat patch on a legacy table
#
# Environment: TASK_DEDUP_POSTGRES_URL, TASK_DEDUP_MYSQL_URL (the test harness's: a
# database per run is created and dropped), ONLINE_ROWS (5000000), ONLINE_DIALECTS
# ("postgres mysql sqlite"), ONLINE_MODES ("online blocking"), ONLINE_START ("first": the
# first migration's table, then every migration; "legacy": a table made by hand, then
# the compat patch, ensure_schema_online or ensure_schema), ONLINE_CARGO_FLAGS (e.g.
# --release; default: the debug build the tests use). Raw lines go to
# bench/results/online-upgrade-<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

export TASK_DEDUP_POSTGRES_URL=${TASK_DEDUP_POSTGRES_URL:-"postgres://postgres@127.0.0.1:5432/test?sslmode=disable"}
export TASK_DEDUP_MYSQL_URL=${TASK_DEDUP_MYSQL_URL:-"mysql://root@127.0.0.1:3306/test"}
rows=${ONLINE_ROWS:-5000000}
dialects=${ONLINE_DIALECTS:-"postgres mysql sqlite"}
modes=${ONLINE_MODES:-"online blocking"}
# shellcheck disable=SC2206
flags=(${ONLINE_CARGO_FLAGS:-})
mkdir -p bench/results
out="bench/results/online-upgrade-$(date -u +%Y%m%dT%H%M%SZ).txt"
echo "rows=$rows $(git rev-parse --short HEAD)" | tee -a "$out"
for dialect in $dialects; do
    if [ "$dialect" = sqlite ]; then
        TASK_DEDUP_LOAD_ROWS=$rows cargo test "${flags[@]}" --test schema online_load::sqlite_build_time \
            -- --ignored --nocapture 2>&1 | grep '^\[load\]' | tee -a "$out"
        continue
    fi
    for mode in $modes; do
        echo "== $dialect $mode ${ONLINE_START:-first}" | tee -a "$out"
        TASK_DEDUP_LOAD_START=${ONLINE_START:-first} TASK_DEDUP_LOAD_DIALECT=$dialect TASK_DEDUP_LOAD_MODE=$mode TASK_DEDUP_LOAD_ROWS=$rows \
            cargo test "${flags[@]}" --test schema online_load::upgrade_under_load \
            -- --ignored --nocapture 2>&1 | grep -E -A1 '^\[load\]|panicked' | grep -v '^--$' \
            | tee -a "$out" || echo "== $dialect $mode failed" | tee -a "$out"
    done
done
echo "raw lines: $out"
