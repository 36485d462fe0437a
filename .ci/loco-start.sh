#!/usr/bin/env bash
# examples/loco started the way its users start a Loco application, on one database:
#
#   .ci/loco-start.sh sqlite|postgres|mysql
#
# 1. `cargo loco db migrate`, then `cargo loco start --server-and-worker` with the
#    development config as generated (no `queue:` section, a pool of one connection;
#    only the database URL, the port and the log level from the environment): the app
#    must come up (`/_readiness`, which pings the queue too);
# 2. 64 concurrent `POST /api/reports` with the same arguments (a report that renders
#    for 1.5 s): every answer names the same job, and the app's own database holds one
#    Report task, succeeded after one attempt, its run logged once; a request after it
#    finished makes and runs a second;
# 3. the server (`cargo loco start`) and a worker (`cargo loco start --worker`) as two
#    processes: a request to the server is run by the worker;
# 4. `cargo loco jobs dump` lists the three Report jobs, `cargo loco jobs tidy` removes
#    them.
#
# PostgreSQL and MySQL/MariaDB use a database `loco_start` on the servers of
# TASK_DEDUP_POSTGRES_URL and TASK_DEDUP_MYSQL_URL (as .ci/run exports them), dropped
# and made afresh; SQLite a file in a temporary folder. CARGO_TARGET_DIR is honoured.
# LOCO_START_PORT (default 5157) is the port the server listens on.
set -euo pipefail
cd "$(dirname "$0")/../examples/loco"

dialect=${1:?usage: .ci/loco-start.sh sqlite|postgres|mysql}
port=${LOCO_START_PORT:-5157}
base="http://127.0.0.1:$port"
work=$(mktemp -d)
started=$SECONDS

say() { printf '\n--> [%s] %s\n' "$dialect" "$*"; }
fail() {
  printf '\n!! [%s] %s\n' "$dialect" "$*" >&2
  for log in "$work"/*.log; do
    [ -e "$log" ] || continue
    printf '\n--- %s (last 40 lines)\n' "$(basename "$log")" >&2
    tail -n 40 "$log" >&2
  done
  exit 1
}

# Each app process runs in a session of its own (cargo and the app's binary): stopped
# as a group with SIGTERM, Loco's graceful shutdown, then SIGKILL if it lingers.
pids=()
stop() { # stop <pid>
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() {
  for pid in "${pids[@]}"; do stop "$pid"; done
  rm -rf "$work"
}
trap cleanup EXIT

# The app's database and a way to read it.
case $dialect in
  sqlite)
    export DATABASE_URL="sqlite://$work/loco_start.sqlite?mode=rwc"
    command -v sqlite3 >/dev/null || fail "sqlite3 (the command-line shell) is needed to read the app's database"
    sql() { sqlite3 -separator ' ' "$work/loco_start.sqlite" "$1"; }
    ;;
  postgres)
    url=${TASK_DEDUP_POSTGRES_URL:?TASK_DEDUP_POSTGRES_URL is not set}
    admin=${url/\/test\?/\/postgres?}
    PGOPTIONS='--client-min-messages=warning' psql "$admin" -qc 'DROP DATABASE IF EXISTS loco_start WITH (FORCE)'
    psql "$admin" -qc 'CREATE DATABASE loco_start'
    export DATABASE_URL=${url/\/test\?/\/loco_start?}
    sql() { psql "$DATABASE_URL" -AtqF ' ' -c "$1"; }
    ;;
  mysql)
    url=${TASK_DEDUP_MYSQL_URL:?TASK_DEDUP_MYSQL_URL is not set}
    mariadb -h 127.0.0.1 -P 3306 -u root -e 'DROP DATABASE IF EXISTS loco_start; CREATE DATABASE loco_start'
    export DATABASE_URL="${url%/test}/loco_start"
    sql() { mariadb -h 127.0.0.1 -P 3306 -u root -N -B loco_start -e "$1" | tr '\t' ' '; }
    ;;
  *) fail "unknown dialect $dialect: sqlite, postgres or mysql" ;;
esac
# The generated development config, with what it reads from the environment.
export PORT=$port BINDING=127.0.0.1 LOG_LEVEL=info

! curl -s -o /dev/null "$base" || fail "something already listens on port $port (LOCO_START_PORT)"

say "building the app"
cargo build --quiet
build_seconds=$((SECONDS - started))

say "cargo loco db migrate"
cargo loco db migrate >"$work/migrate.log" 2>&1 || fail "cargo loco db migrate failed"
[ "$(sql "SELECT COUNT(*) FROM task_run")" = 0 ] || fail "no empty task_run after the migration"

start() { # start <log name> <cargo loco start flags...>: its process id in $pid
  local name=$1; shift
  # The session leader writes its own id: setsid may fork, and $! is then not the app.
  setsid sh -c 'echo $$ >"$0"; exec cargo loco start "$@"' "$work/$name.pid" "$@" \
    >"$work/$name.log" 2>&1 &
  for _ in $(seq 1 50); do
    [ -s "$work/$name.pid" ] && break
    sleep 0.1
  done
  pid=$(cat "$work/$name.pid" 2>/dev/null) || fail "cargo loco start $* did not start"
  pids+=("$pid")
}

wait_ready() { # wait_ready <pid>: the server answers /_readiness, or the process died
  local pid=$1
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || fail "the app exited instead of starting"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/_readiness")" = 200 ] && return 0
    sleep 0.2
  done
  fail "the app did not answer /_readiness within 60 s"
}

wait_for_log() { # wait_for_log <pid> <log name> <text>: the process logged the text
  local pid=$1 name=$2 text=$3
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || fail "the process of $name.log exited"
    grep -qF "$text" "$work/$name.log" && return 0
    sleep 0.2
  done
  fail "$name.log does not say '$text' within 60 s"
}

# The Report tasks of user $1, a `status attempts` line each, oldest first.
reports() {
  sql "SELECT status, attempts FROM task_run WHERE task_type = 'Report' AND user_id = '$1' ORDER BY created_at"
}

wait_finished() { # wait_finished <user> <count>: that many Report tasks, none active
  local user=$1 count=$2 rows
  for _ in $(seq 1 150); do
    rows=$(reports "$user")
    if [ "$(grep -c . <<<"$rows")" -ge "$count" ] && ! grep -qE '^(queued|running)' <<<"$rows"; then
      return 0
    fi
    sleep 0.2
  done
  fail "user $user's reports did not finish within 30 s: $rows"
}

request() { # request <user> <render ms> [concurrent requests]: the answers' job ids
  local body="{\"user_id\": $1, \"month\": \"2026-12\", \"render_ms\": $2}" n=${3:-1}
  local urls=()
  for _ in $(seq 1 "$n"); do urls+=("$base/api/reports"); done
  curl -sS --no-progress-meter --fail-with-body --parallel --parallel-immediate --parallel-max "$n" \
    -H 'content-type: application/json' -d "$body" -w '\n' "${urls[@]}" >"$work/answers" ||
    fail "a request failed: $(cat "$work/answers")"
  jq -r '.job_id' <"$work/answers"
}

say "cargo loco start --server-and-worker"
start server-and-worker --server-and-worker
app=$pid
wait_ready "$app"
wait_for_log "$app" server-and-worker "worker is online"

say "64 concurrent requests for one report"
ids=$(request 42 1500 64)
[ "$(grep -c . <<<"$ids")" = 64 ] || fail "expected 64 answers, got: $ids"
[ "$(sort -u <<<"$ids" | grep -c .)" = 1 ] || fail "the 64 requests were answered with several jobs: $(sort <<<"$ids" | uniq -c)"
wait_finished 42 1
[ "$(reports 42)" = "succeeded 1" ] || fail "user 42's Report tasks: $(reports 42)"
[ "$(sql "SELECT COUNT(*) FROM task_run WHERE task_type = 'Report'")" = 1 ] ||
  fail "more than one Report task was stored"
[ "$(grep -c 'report rendered' "$work/server-and-worker.log")" = 1 ] ||
  fail "the report was not rendered exactly once: $(grep -c 'report rendered' "$work/server-and-worker.log")"
echo "64 requests -> job $(head -n 1 <<<"$ids"), one task, succeeded at its first attempt, rendered once"

say "a request after it finished: a second job"
second=$(request 42 0)
[ "$second" != "$(head -n 1 <<<"$ids")" ] || fail "the finished job was handed out again"
wait_finished 42 2
[ "$(reports 42)" = "$(printf 'succeeded 1\nsucceeded 1')" ] || fail "user 42's Report tasks: $(reports 42)"
[ "$(grep -c 'report rendered' "$work/server-and-worker.log")" = 2 ] || fail "the second report was not rendered"
echo "job $second, run once: two tasks, two renders"
stop "$app"

say "cargo loco start and cargo loco start --worker, two processes"
start server
server=$pid
wait_ready "$server"
start worker --worker
worker=$pid
wait_for_log "$worker" worker "worker is online"
third=$(request 43 0)
wait_finished 43 1
[ "$(reports 43)" = "succeeded 1" ] || fail "user 43's Report tasks: $(reports 43)"
grep -q 'report rendered' "$work/worker.log" || fail "the worker process did not render the report"
! grep -q 'report rendered' "$work/server.log" || fail "the server process rendered a report"
echo "job $third: enqueued by the server, run by the worker"
stop "$worker"
stop "$server"

say "cargo loco jobs dump and tidy: Loco's own commands on the queue"
cargo loco jobs dump --folder "$work/dump" >"$work/jobs.log" 2>&1 || fail "cargo loco jobs dump failed"
[ "$(cat "$work"/dump/*.yaml | grep -c '^  name: Report$')" = 3 ] ||
  fail "the dump does not list the three Report jobs: $(cat "$work"/dump/*.yaml)"
cargo loco jobs tidy >>"$work/jobs.log" 2>&1 || fail "cargo loco jobs tidy failed"
[ "$(sql "SELECT COUNT(*) FROM task_run WHERE task_type = 'Report'")" = 0 ] ||
  fail "cargo loco jobs tidy left finished jobs: $(reports 42; reports 43)"
echo "dump: the three Report jobs; tidy: removed"

say "passed in $((SECONDS - started)) s (building: $build_seconds s)"
