#!/usr/bin/env bash
# PgBouncer in front of the test PostgreSQL (127.0.0.1:5432), for the pooler suite
# (tests/connections/pgbouncer.rs), in transaction pooling:
#
#   eval "$(.ci/pgbouncer.sh start)"        # PgBouncer 1.25 on 127.0.0.1:6432
#   eval "$(.ci/pgbouncer.sh start old)"    # and Debian's PgBouncer 1.18 on 127.0.0.1:6433
#   .ci/pgbouncer.sh stop
#
# `start` prints the `export TASK_DEDUP_PGBOUNCER_URL=...` (and, with `old`,
# `TASK_DEDUP_PGBOUNCER_OLD_URL=...`) lines to eval; everything else goes to stderr.
# PgBouncer 1.25 is built from ../shared/vendor with ../shared/tools/pgbouncer-build.sh
# into target/pgbouncer (about 15 s, once); 1.18 is Debian's package (apt-get install).
# Both: auth_type trust for the user postgres, `* = host=127.0.0.1 port=5432` (every
# database the test harness creates on the server is reachable by the same name), and
# 1.25 with max_prepared_statements = 200 (tracks sqlx's named statements); 1.18 has no
# such setting. Each runs as the postgres user (PgBouncer refuses root) from its own
# directory under $TMPDIR/task-dedup-pgbouncer, log included.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir="$root/target/pgbouncer"
# Configuration, log and pid file where the postgres user can reach them (a clone under
# /root could not be).
runs=${TMPDIR:-/tmp}/task-dedup-pgbouncer
user=postgres
url() { echo "postgres://postgres@127.0.0.1:$1/test?sslmode=disable"; }

say() { printf '%s\n' "$*" >&2; }

# run <name> <binary> <port> <extra settings...>: writes its configuration and starts it.
run() {
  local name=$1 bin=$2 port=$3
  shift 3
  local run="$runs/$name"
  stop_one "$name"
  mkdir -p "$run"
  chmod 755 "$runs"
  echo '"postgres" ""' >"$run/userlist.txt"
  {
    echo '[databases]'
    echo '* = host=127.0.0.1 port=5432'
    echo '[pgbouncer]'
    echo 'listen_addr = 127.0.0.1'
    echo "listen_port = $port"
    echo 'unix_socket_dir ='
    echo 'auth_type = trust'
    echo "auth_file = $run/userlist.txt"
    echo 'pool_mode = transaction'
    # sqlx sets extra_float_digits at connect; PgBouncer refuses startup parameters it
    # does not know unless told to ignore them.
    echo 'ignore_startup_parameters = extra_float_digits'
    # Plain TCP to the server, as the direct connection has (1.25 prefers TLS).
    echo 'server_tls_sslmode = disable'
    echo 'max_client_conn = 1000'
    echo 'default_pool_size = 20'
    echo "logfile = $run/pgbouncer.log"
    echo "pidfile = $run/pgbouncer.pid"
    printf '%s\n' "$@"
  } >"$run/pgbouncer.ini"
  chown -R "$user" "$run"
  "$bin" -d -u "$user" "$run/pgbouncer.ini" >&2
  for _ in $(seq 1 50); do
    if psql "$(url "$port")" -Atqc 'SELECT 1' >/dev/null 2>&1; then
      say "PgBouncer $name on 127.0.0.1:$port (log: $run/pgbouncer.log)"
      return 0
    fi
    sleep 0.2
  done
  say "PgBouncer $name did not come up on 127.0.0.1:$port; its log:"
  tail -n 20 "$run/pgbouncer.log" >&2 || true
  exit 1
}

stop_one() {
  local pidfile="$runs/$1/pgbouncer.pid"
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

case "${1:-}" in
  start)
    bin=$("$root/../shared/tools/pgbouncer-build.sh" "$dir")
    run 1.25 "$bin" 6432 'max_prepared_statements = 200'
    echo "export TASK_DEDUP_PGBOUNCER_URL='$(url 6432)'"
    if [ "${2:-}" = old ]; then
      if [ ! -x /usr/sbin/pgbouncer ]; then
        say "installing Debian's pgbouncer"
        apt-get update -qq
        # Its package starts a pgbouncer of its own on 6432 where it can: not here.
        DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq pgbouncer >/dev/null
        /etc/init.d/pgbouncer stop >/dev/null 2>&1 || true
      fi
      run 1.18 /usr/sbin/pgbouncer 6433
      echo "export TASK_DEDUP_PGBOUNCER_OLD_URL='$(url 6433)'"
    fi
    ;;
  stop)
    stop_one 1.25
    stop_one 1.18
    ;;
  *)
    say "usage: $0 start [old] | stop"
    exit 2
    ;;
esac
