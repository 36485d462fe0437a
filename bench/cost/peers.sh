#!/usr/bin/env bash
# The physical write cost per task of three peer PostgreSQL job queues, phase by phase
# (enqueue, claim, ending, and the life), measured from the WAL with pg_walinspect:
# Loco 1.2.0's PgQueue (its statements from loco-rs src/bgworker/pg.rs replayed one job each),
# graphile-worker and pg-boss (versions pinned in bench/cost/package-lock.json). Each peer
# gets a fresh database (cost_loco, cost_graphile, cost_pgboss, dropped and recreated), one
# CHECKPOINT before its enqueue phase, no worker running in the background. The figures of
# a phase are bench/cost/phase.sql between pg_current_wal_insert_lsn() before and after it.
#
#   bench/cost/peers.sh
#   COST_TASKS=1000 COST_PEERS=graphile,pgboss bench/cost/peers.sh     # a quick look
#
# Environment: COST_PG_URL (postgres://postgres@127.0.0.1:5432, the server; PostgreSQL 15 with
# contrib's pg_walinspect, a superuser: CHECKPOINT, DROP DATABASE ... WITH (FORCE)),
# COST_TASKS (10000), COST_PEERS (loco,graphile,pgboss). Needs node >= 20, npm and psql.
# The npm packages go to bench/cost/node_modules (npm ci). Output also goes to
# bench/results/cost-peers-<timestamp>.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."

(cd bench/cost && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
mkdir -p bench/results
out=bench/results/cost-peers-$(date -u +%Y%m%dT%H%M%SZ).txt
node bench/cost/peers.mjs | tee "$out"
echo "results: $out"
