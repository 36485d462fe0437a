#!/usr/bin/env bash
# A local pg_auto_failover formation (PostgreSQL 15) for the failover tests: a monitor
# and two data nodes with synchronous replication, all on 127.0.0.1.
#
#   eval "$(.ci/pg-auto-failover.sh start)"   # monitor :5440, nodes :5441 and :5442
#   .ci/pg-auto-failover.sh switchover        # planned switchover, prints write downtime
#   .ci/pg-auto-failover.sh kill-primary      # crash the primary (keeper + postgres), returns at once
#   .ci/pg-auto-failover.sh wait-primary      # until writable primary + secondary again
#   .ci/pg-auto-failover.sh primary           # port of the current primary
#   .ci/pg-auto-failover.sh status            # pg_autoctl show state
#   .ci/pg-auto-failover.sh stop [--clean]    # stop everything (--clean: remove the dir)
#
# `start` prints only `export TASK_DEDUP_PGAF_*=...` lines on stdout (the multi-host URL,
# one URL per node, the monitor's); everything else goes to stderr. It is idempotent: when
# the formation already runs it only prints the exports; when the directory exists but
# nothing runs it restarts the existing nodes. Environment: PGAF_DIR, PGAF_TIMEOUT (seconds
# to wait for a healthy formation, 120), PGAF_FAST_FAILOVER (1; 0 = the monitor's defaults).
#
# Everything lives under ${PGAF_DIR:-/tmp/task-dedup-pgaf}: data directories, pg_autoctl's
# configuration/state/pid files (XDG_* point there rather than at ~postgres), and logs
# (<node>.log for `pg_autoctl run`, <node>-create.log for `pg_autoctl create`). pg_autoctl
# and postgres run as the postgres user, so the directory must be reachable by it (/tmp is;
# a clone under /root is not).
#
# Replication: with one standby, pg_auto_failover refuses number_sync_standbys = 1 ("At
# least 2 standby nodes are required"), so the formation keeps the default 0. Replication is
# still synchronous: both nodes default to replication-quorum true and candidate-priority 50,
# and the primary gets synchronous_standby_names = 'ANY 1 (pgautofailover_standby_N)' with
# synchronous_commit = on; `start` checks that setting is non-empty. If the standby goes
# away the monitor moves the primary to wait_primary, which clears it (writes go on, async).
#
# Failover: `kill-primary` SIGKILLs the primary's keeper (`pg_autoctl run` and its service
# processes) and then runs `pg_ctl stop -m immediate` on its postgres, like a host crash.
# Stopping postgres alone is not a failover: the keeper restarts it within a second and
# keeps reporting it as running, so the monitor keeps the node primary (9 of 10 tries here:
# about 1 s of refused connections, same primary). In the other try the keeper reported "not
# running" before the restart, and the monitor failed over at once. With the keeper dead
# the monitor decides on its own: no report for node_considered_unhealthy_timeout plus failed
# health checks, then primary_demote_timeout (see tune_monitor: about 10 s here instead of
# about 50 s with the defaults). `wait-primary` restarts the dead keeper once a new primary
# takes writes, and the old primary rejoins as a standby (pg_rewind).
set -euo pipefail

dir=$(realpath -m "${PGAF_DIR:-/tmp/task-dedup-pgaf}")
pgbin=/usr/lib/postgresql/15/bin
monitor_port=5440
node_ports=(5441 5442)
nodes=(node1 node2)
timeout_s=${PGAF_TIMEOUT:-120}

say() { printf '%s\n' "$*" >&2; }
die() { say "pg-auto-failover: $*"; exit 1; }
now() { printf '%s' "$EPOCHREALTIME"; }
# elapsed START: seconds since START (an EPOCHREALTIME), 3 decimals.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'; }

# pg_autoctl and postgres refuse to run as root. XDG_* keep pg_autoctl's config, state and pid
# files inside $dir, so several directories (or a `--clean`) never see stale ones.
pg_prefix=(env "XDG_CONFIG_HOME=$dir/config" "XDG_DATA_HOME=$dir/share" "XDG_RUNTIME_DIR=$dir/run"
  "PATH=$pgbin:/usr/bin:/bin" "PG_CONFIG=$pgbin/pg_config")
if [ "$(id -u)" = 0 ]; then pg_prefix=(runuser -u postgres -- "${pg_prefix[@]}"); fi
# From $dir: the postgres user may not be allowed into the caller's working directory.
as_pg() { (cd "$dir" && exec "${pg_prefix[@]}" "$@"); }

node_url() { echo "postgres://postgres@127.0.0.1:$1/test?sslmode=disable"; }
monitor_url() { echo "postgres://autoctl_node@127.0.0.1:$monitor_port/pg_auto_failover?sslmode=disable"; }

# q PORT DB SQL: one psql call with a short connect timeout; prints the unaligned result.
q() {
  local user=postgres
  [ "$2" = pg_auto_failover ] && user=autoctl_node
  timeout 5 psql "host=127.0.0.1 port=$1 dbname=$2 user=$user sslmode=disable connect_timeout=2" \
    -XAtq -c "$3" 2>/dev/null
}

# writable PORT: a committed write (temp-table catalog rows are WAL-logged, so the commit
# also waits for the synchronous standby); leaves nothing behind.
writable() {
  q "$1" test "BEGIN; CREATE TEMP TABLE pgaf_w(x int) ON COMMIT DROP; INSERT INTO pgaf_w VALUES (1); COMMIT;" >/dev/null
}

# The monitor's view: "name port reported assigned" per data node.
node_states() {
  q "$monitor_port" pg_auto_failover \
    "SELECT nodename, nodeport, reportedstate, goalstate FROM pgautofailover.node WHERE formationid = 'default' ORDER BY nodeid" |
    tr '|' ' '
}

# Healthy = exactly one node primary/primary and one secondary/secondary.
healthy() {
  local s
  s=$(node_states) || return 1
  [ "$(grep -c ' primary primary$' <<<"$s")" = 1 ] && [ "$(grep -c ' secondary secondary$' <<<"$s")" = 1 ]
}

# The port of the node the monitor considers primary (also while alone: wait_primary, single).
primary_port() {
  node_states | awk '$3 == $4 && ($3 == "primary" || $3 == "wait_primary" || $3 == "single") { print $2; exit }'
}

keeper_pid() { # keeper_pid NAME: pid of its running `pg_autoctl run`, or nothing
  local f="$dir/run/pg_autoctl$dir/$1/pg_autoctl.pid" pid
  [ -f "$f" ] || return 0
  pid=$(head -n1 "$f")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q pg_autoctl "/proc/$pid/cmdline" 2>/dev/null; then
    echo "$pid"
  fi
}

# run_keeper NAME: `pg_autoctl run` in the background, in its own session (setsid) so it
# outlives this script and the caller's process group, output into NAME.log.
run_keeper() {
  [ -n "$(keeper_pid "$1")" ] && return 0
  say "starting pg_autoctl run for $1 (log: $dir/$1.log)"
  # exec: no copy of this script stays behind as the keeper's parent.
  (cd "$dir" && exec setsid "${pg_prefix[@]}" pg_autoctl run --pgdata "$dir/$1") >>"$dir/$1.log" 2>&1 </dev/null &
  disown
  local i
  for i in $(seq 1 100); do
    [ -n "$(keeper_pid "$1")" ] && return 0
    sleep 0.1
  done
  tail -n 20 "$dir/$1.log" >&2
  die "pg_autoctl run for $1 did not start"
}

# create NAME ARGS...: `pg_autoctl create ...` into NAME-create.log, loud on failure.
create() {
  local name=$1
  shift
  say "pg_autoctl create $* (log: $dir/$name-create.log)"
  if ! as_pg pg_autoctl create "$@" >"$dir/$name-create.log" 2>&1 </dev/null; then
    tail -n 30 "$dir/$name-create.log" >&2
    die "pg_autoctl create for $name failed (remove $dir with: $0 stop --clean)"
  fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The tests connect as postgres to `test` from 127.0.0.1 without a password. initdb --auth
# trust (what --auth trust asks for) already writes these lines; add them if ever missing.
# The standby gets its pg_hba.conf from the primary through pg_basebackup.
ensure_hba() {
  local hba="$dir/$1/pg_hba.conf" changed=
  grep -Eq '^host[[:space:]]+all[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$hba" ||
    { echo 'host all all 127.0.0.1/32 trust' >>"$hba"; changed=1; }
  grep -Eq '^host[[:space:]]+replication[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$hba" ||
    { echo 'host replication all 127.0.0.1/32 trust' >>"$hba"; changed=1; }
  if [ -n "$changed" ]; then
    as_pg "$pgbin/pg_ctl" reload -D "$dir/$1" >/dev/null 2>&1 || true
  fi
}

wait_monitor() {
  local i
  for i in $(seq 1 $((timeout_s * 5))); do
    q "$monitor_port" pg_auto_failover "SELECT 1 FROM pgautofailover.formation LIMIT 1" >/dev/null && return 0
    sleep 0.2
  done
  tail -n 20 "$dir/monitor.log" >&2
  die "the monitor did not come up on 127.0.0.1:$monitor_port"
}

# Monitor timings. pg_auto_failover's defaults make an unannounced primary loss take about
# 50 s to a writable standby: node_considered_unhealthy_timeout (20 s without a keeper report,
# plus failed health checks every 5 s) and then primary_demote_timeout (30 s for the old
# primary to demote itself, in case it is alive behind a partition). A test formation on one
# host has no partitions, so by default shorten them to fail over in about 10 s;
# PGAF_FAST_FAILOVER=0 restores pg_auto_failover's defaults.
tune_monitor() {
  local settings=(node_considered_unhealthy_timeout=5000 primary_demote_timeout=5000
    health_check_period=1000 health_check_retry_delay=500 health_check_timeout=2000) args=() kv
  for kv in "${settings[@]}"; do
    if [ "${PGAF_FAST_FAILOVER:-1}" = 1 ]; then
      args+=(-c "ALTER SYSTEM SET pgautofailover.${kv%%=*} = ${kv#*=}")
    else
      args+=(-c "ALTER SYSTEM RESET pgautofailover.${kv%%=*}")
    fi
  done
  psql "host=127.0.0.1 port=$monitor_port dbname=pg_auto_failover user=postgres sslmode=disable" -XAtq \
    "${args[@]}" -c "SELECT pg_reload_conf()" >/dev/null || die "could not set the monitor's timings"
}

# wait_node_registered NAME: until the monitor has the node in a settled state (node1 must be
# primary-like before node2 can clone it).
wait_node_registered() {
  local i
  for i in $(seq 1 $((timeout_s * 5))); do
    node_states | grep -Eq "^$1 [0-9]+ (single|wait_primary|primary) (single|wait_primary|primary)$" && return 0
    sleep 0.2
  done
  node_states >&2 || true
  die "$1 did not reach single/primary"
}

# wait_healthy LABEL START: primary + secondary, synchronous_standby_names set on the
# primary, and a write going through; dies after $timeout_s.
wait_healthy() {
  local label=$1 start=$2 p ssn
  while :; do
    if healthy; then
      p=$(primary_port)
      ssn=$(q "$p" test "SHOW synchronous_standby_names" || true)
      if [ -n "$ssn" ] && writable "$p"; then
        say "$label: primary on :$p, synchronous_standby_names = $ssn ($(elapsed "$start") s)"
        return 0
      fi
    fi
    if awk -v a="$start" -v b="$EPOCHREALTIME" -v t="$timeout_s" 'BEGIN { exit !(b - a > t) }'; then
      say "$label: no primary + secondary after ${timeout_s} s; pg_autoctl show state:"
      as_pg pg_autoctl show state --pgdata "$dir/monitor" >&2 || true
      for n in monitor "${nodes[@]}"; do say "--- $n.log"; tail -n 15 "$dir/$n.log" >&2 || true; done
      exit 1
    fi
    sleep 0.25
  done
}

print_exports() {
  local uri
  # The multi-host URL the monitor hands out, as user postgres and without TLS (--no-ssl).
  uri=$(as_pg pg_autoctl show uri --pgdata "$dir/monitor" --formation default 2>/dev/null | tail -n1)
  [ -n "$uri" ] || die "pg_autoctl show uri gave nothing"
  uri=$(sed -e 's#^postgres://#postgres://postgres@#' -e 's#sslmode=[a-z-]*#sslmode=disable#' <<<"$uri")
  echo "export TASK_DEDUP_PGAF_URL=\"$uri\""
  echo "export TASK_DEDUP_PGAF_NODE1_URL=\"$(node_url "${node_ports[0]}")\""
  echo "export TASK_DEDUP_PGAF_NODE2_URL=\"$(node_url "${node_ports[1]}")\""
  echo "export TASK_DEDUP_PGAF_MONITOR_URL=\"$(monitor_url)\""
}

cmd_start() {
  local start i
  start=$(now)
  # pg_autoctl (pg-auto-failover-cli) and the monitor's extension (postgresql-15-auto-failover).
  if [ ! -x /usr/bin/pg_autoctl ] || [ ! -f /usr/share/postgresql/15/extension/pgautofailover.control ]; then
    say "installing postgresql-15-auto-failover"
    { apt-get install -y postgresql-15-auto-failover || { apt-get update && apt-get install -y postgresql-15-auto-failover; }; } >&2
  fi
  mkdir -p "$dir/run"
  chmod 755 "$dir"
  chmod 700 "$dir/run"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir" "$dir/run"; fi
  as_pg test -w "$dir" || die "$dir is not writable by the postgres user"

  # Already up: only the exports (after a quick health check).
  if [ -n "$(keeper_pid monitor)" ] && [ -n "$(keeper_pid node1)" ] && [ -n "$(keeper_pid node2)" ]; then
    tune_monitor
    wait_healthy "already running" "$start"
    print_exports
    return 0
  fi
  for i in 0 1 2; do
    local name port
    name=$([ "$i" = 0 ] && echo monitor || echo "${nodes[$((i - 1))]}")
    port=$([ "$i" = 0 ] && echo "$monitor_port" || echo "${node_ports[$((i - 1))]}")
    [ -n "$(keeper_pid "$name")" ] || port_free "$port" || die "port $port is taken by something else"
  done

  # Restart of an existing formation; `stop` left the standby in maintenance so that the
  # primary's restart cannot trigger a failover (see cmd_stop). Take it out once both run.
  if [ -f "$dir/monitor/PG_VERSION" ] && [ -f "$dir/node1/PG_VERSION" ] && [ -f "$dir/node2/PG_VERSION" ]; then
    run_keeper monitor
    wait_monitor
    tune_monitor
    for i in 0 1; do
      ensure_hba "${nodes[$i]}"
      run_keeper "${nodes[$i]}"
    done
    if [ -f "$dir/maintenance-by-stop" ]; then
      local standby
      standby=$(cat "$dir/maintenance-by-stop")
      for i in $(seq 1 $((timeout_s * 4))); do
        node_states | grep -Eq "^$standby [0-9]+ maintenance maintenance$" && break
        sleep 0.25
      done
      as_pg timeout 60 pg_autoctl disable maintenance --pgdata "$dir/$standby" >>"$dir/maintenance.log" 2>&1 ||
        say "disable maintenance on $standby failed (see $dir/maintenance.log)"
      rm -f "$dir/maintenance-by-stop"
    fi
    wait_healthy "formation up" "$start"
    print_exports
    return 0
  fi

  # Monitor. It has no --listen: point listen_addresses at loopback before its first run.
  if [ ! -f "$dir/monitor/PG_VERSION" ]; then
    create monitor monitor --pgdata "$dir/monitor" --pgport "$monitor_port" --pgctl "$pgbin/pg_ctl" \
      --hostname 127.0.0.1 --auth trust --no-ssl --ssl-mode disable
    as_pg pg_autoctl config set --pgdata "$dir/monitor" postgresql.listen_addresses 127.0.0.1 >/dev/null
  fi
  run_keeper monitor
  wait_monitor

  # Data nodes, one after the other: node2 is cloned (pg_basebackup) from node1, which must be
  # running and registered first. `create` without --run initialises the node then exits;
  # `pg_autoctl run` is then the long-lived keeper.
  for i in 0 1; do
    local name=${nodes[$i]} port=${node_ports[$i]}
    if [ ! -f "$dir/$name/PG_VERSION" ]; then
      create "$name" postgres --pgdata "$dir/$name" --pgport "$port" --pgctl "$pgbin/pg_ctl" \
        --listen 127.0.0.1 --hostname 127.0.0.1 --name "$name" --dbname test \
        --monitor "$(monitor_url)" --auth trust --no-ssl --ssl-mode disable
    fi
    ensure_hba "$name"
    run_keeper "$name"
    if [ "$i" = 0 ]; then wait_node_registered "$name"; fi
  done

  wait_healthy "formation up" "$start"
  # Only now: 1 s health checks would flag node2 while pg_basebackup runs and slow its join.
  tune_monitor
  print_exports
}

# stop_keeper NAME: SIGTERM through `pg_autoctl stop` (it stops its postgres, fast mode),
# then --immediate, then SIGKILL; finally makes sure no postmaster is left.
stop_keeper() {
  local name=$1 pid i
  pid=$(keeper_pid "$name")
  if [ -n "$pid" ]; then
    as_pg pg_autoctl stop --pgdata "$dir/$name" >/dev/null 2>&1 || true
    for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "$name: pg_autoctl still running after 30 s, stopping it --immediate"
      as_pg pg_autoctl stop --immediate --pgdata "$dir/$name" >/dev/null 2>&1 || true
      for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  if [ -f "$dir/$name/postmaster.pid" ] && as_pg "$pgbin/pg_ctl" status -D "$dir/$name" >/dev/null 2>&1; then
    say "$name: postgres still running without its keeper, stopping it"
    as_pg "$pgbin/pg_ctl" stop -D "$dir/$name" -m fast -w -t 30 >/dev/null 2>&1 ||
      as_pg "$pgbin/pg_ctl" stop -D "$dir/$name" -m immediate -w >/dev/null 2>&1 || true
  fi
}

cmd_stop() {
  if [ -d "$dir" ]; then
    # A restarted primary keeper's first report to the monitor says "Postgres not running"
    # (it has not started it yet), which the monitor takes as a failure and fails over,
    # even to a standby whose keeper is not back yet. A standby in maintenance is never a
    # failover candidate, so park the standby there and let `start` take it out again.
    local standby
    if healthy; then
      standby=$(node_states | awk '$3 == "secondary" { print $1; exit }')
      if as_pg timeout 30 pg_autoctl enable maintenance --pgdata "$dir/$standby" >"$dir/maintenance.log" 2>&1; then
        echo "$standby" >"$dir/maintenance-by-stop"
      else
        say "could not put $standby in maintenance (see $dir/maintenance.log); a failover may follow the next start"
      fi
    fi
    # The monitor first: with it gone nothing can decide a failover while the nodes stop;
    # then the standby, then the primary.
    local p first=node1 second=node2
    p=$(primary_port || true)
    if [ "$p" = "${node_ports[0]}" ]; then first=node2 second=node1; fi
    stop_keeper monitor
    stop_keeper "$first"
    stop_keeper "$second"
    say "formation under $dir stopped"
  fi
  if [ "${1:-}" = --clean ]; then
    rm -rf "$dir"
    say "removed $dir"
  fi
}

# write_gap UNTIL_CMD...: tries a write through the multi-host URL every 50 ms until
# UNTIL_CMD succeeds after a write did; prints the longest gap between two successful writes.
write_gap() {
  local url="host=127.0.0.1,127.0.0.1 port=${node_ports[0]},${node_ports[1]} dbname=test user=postgres sslmode=disable connect_timeout=1 target_session_attrs=read-write"
  local last_ok="" gap=0 t start
  start=$(now)
  while :; do
    t=$(now)
    if awk -v a="$start" -v b="$t" -v t="$timeout_s" 'BEGIN { exit !(b - a > t) }'; then
      echo timeout
      return 0
    fi
    if timeout 3 psql "$url" -XAtq -c "BEGIN; CREATE TEMP TABLE pgaf_w(x int) ON COMMIT DROP; INSERT INTO pgaf_w VALUES (1); COMMIT;" >/dev/null 2>&1; then
      if [ -n "$last_ok" ]; then
        gap=$(awk -v a="$last_ok" -v b="$t" -v g="$gap" 'BEGIN { d = b - a; printf "%.3f", (d > g ? d : g) }')
      fi
      last_ok=$t
      "$@" && break
    fi
    sleep 0.05
  done
  echo "$gap"
}

switchover_done() { [ ! -e "$dir/switchover.running" ] && healthy; }

cmd_switchover() {
  local before after start gap rc
  healthy || die "not primary + secondary before the switchover; see: $0 status"
  before=$(primary_port)
  start=$(now)
  touch "$dir/switchover.running"
  # perform switchover waits for the monitor to report the end (60 s at most); run it beside
  # the write poller so the poller sees the whole outage.
  (
    rc=0
    as_pg pg_autoctl perform switchover --pgdata "$dir/monitor" >"$dir/switchover.log" 2>&1 || rc=$?
    echo "$rc" >"$dir/switchover.rc"
    rm -f "$dir/switchover.running"
  ) &
  gap=$(write_gap switchover_done)
  wait
  [ "$gap" != timeout ] || die "no write went through, or the formation did not settle, within ${timeout_s} s"
  rc=$(cat "$dir/switchover.rc")
  after=$(primary_port)
  [ "$rc" = 0 ] || { cat "$dir/switchover.log" >&2; die "pg_autoctl perform switchover failed ($rc)"; }
  [ "$after" != "$before" ] || die "the primary is still :$before after the switchover"
  say "switchover :$before -> :$after in $(elapsed "$start") s; writes unavailable for at most $gap s (50 ms polling)"
}

cmd_kill_primary() {
  local p name pid
  p=$(primary_port)
  [ -n "$p" ] || die "no primary to kill"
  name=${nodes[0]}
  if [ "$p" = "${node_ports[1]}" ]; then name=${nodes[1]}; fi
  now >"$dir/kill-primary.at"
  echo "$name" >"$dir/kill-primary.node"
  # The keeper first (SIGKILL: `pg_autoctl run` and its service children, found by parent
  # pid), as if the host died: a live keeper restarts postgres within a second and keeps
  # the node primary (see the top of this file).
  pid=$(keeper_pid "$name")
  if [ -n "$pid" ]; then
    local pids
    mapfile -t pids < <(pgrep -P "$pid" || true)
    kill -KILL "$pid" "${pids[@]}" 2>/dev/null || true
  fi
  # -W: pg_ctl returns once the signal is sent.
  as_pg "$pgbin/pg_ctl" stop -D "$dir/$name" -m immediate -W >/dev/null
  say "killed the primary $name (:$p): keeper SIGKILLed, postgres stopped -m immediate"
}

cmd_wait_primary() {
  local start old="" p t_write="" label=wait-primary n
  if [ -f "$dir/kill-primary.at" ]; then
    start=$(cat "$dir/kill-primary.at")
    old=$(cat "$dir/kill-primary.node")
    label="since kill-primary"
  else
    start=$(now)
  fi
  while :; do
    p=$(primary_port || true)
    if [ -z "$t_write" ] && [ -n "$p" ] && writable "$p"; then
      t_write=$(elapsed "$start")
      say "writable primary :$p after $t_write s ($label)"
      # The killed node's keeper: back now, so the old primary rejoins as a standby
      # (pg_rewind) instead of coming back while it is still the primary for the monitor.
      for n in "${nodes[@]}"; do run_keeper "$n"; done
    fi
    if [ -n "$t_write" ] && healthy; then
      say "primary :$(primary_port) + secondary after $(elapsed "$start") s ($label)"
      rm -f "$dir/kill-primary.at" "$dir/kill-primary.node"
      return 0
    fi
    if awk -v a="$start" -v b="$EPOCHREALTIME" -v t="$timeout_s" 'BEGIN { exit !(b - a > t) }'; then
      as_pg pg_autoctl show state --pgdata "$dir/monitor" >&2 || true
      die "no writable primary + secondary after ${timeout_s} s${old:+ (killed: $old)}"
    fi
    sleep 0.1
  done
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop "${2:-}" ;;
  switchover) cmd_switchover ;;
  kill-primary) cmd_kill_primary ;;
  wait-primary) cmd_wait_primary ;;
  primary)
    p=$(primary_port || true)
    [ -n "$p" ] || die "no primary right now"
    echo "$p"
    ;;
  status) as_pg pg_autoctl show state --pgdata "$dir/monitor" ;;
  *)
    say "usage: $0 start | stop [--clean] | switchover | kill-primary | wait-primary | primary | status"
    exit 2
    ;;
esac
