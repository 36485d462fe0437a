#!/usr/bin/env bash
# A local three-node MariaDB Galera cluster, for the tests that run the queue against
# several writable primaries at once:
#
#   eval "$(.ci/galera.sh start)"   # nodes on 127.0.0.1:3311, 3312, 3313
#   .ci/galera.sh kill N            # kill -9 of node N (1..3), returns at once
#   .ci/galera.sh restart N         # node N rejoins the running cluster, waits for Synced
#   .ci/galera.sh status            # cluster size, each node's state and RSS
#   .ci/galera.sh stop [--clean]    # clean shutdown; --clean also removes the datadirs
#
# `start` prints only lines to eval (TASK_DEDUP_GALERA_URLS, and the commands for
# killing and restarting a node); progress goes to stderr. It is idempotent: nodes
# already up are left alone, missing ones join. Each node lives in
# ${GALERA_DIR:-/tmp/task-dedup-galera}/nodeN (configuration, error log, socket, pid
# file; the datadir in nodeN/data), owned by mysql, which mariadbd runs as. Every node
# gets database `test` and root@127.0.0.1 with no password and all rights, as the CI's
# standalone server on 3306 (never touched here) has.
#
# Ports, node N: client 331N; Galera base_port 45N1 (4571, 4581, 4591), IST 45N2,
# rsync SST 45N3. GALERA_TIMEOUT (default 120 s) bounds every wait.
set -euo pipefail

base=${GALERA_DIR:-/tmp/task-dedup-galera}
timeout=${GALERA_TIMEOUT:-120}
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
mariadbd=/usr/sbin/mariadbd
provider=/usr/lib/galera/libgalera_smm.so
nodes=(1 2 3)
cluster_address=gcomm://127.0.0.1:4571,127.0.0.1:4581,127.0.0.1:4591

say() { printf '[galera] %s\n' "$*" >&2; }
die() { printf '[galera] error: %s\n' "$*" >&2; exit 1; }

dir() { echo "$base/node$1"; }
client_port() { echo $((3310 + $1)); }
galera_port() { echo $((4561 + 10 * $1)); }
url() { echo "mysql://root@127.0.0.1:$(client_port "$1")/test"; }

# SQL over node N's socket, as root by unix_socket authentication (no password to
# know). --no-defaults: /etc/mysql/my.cnf names the standalone server's socket.
sql() {
  local n=$1
  shift
  mariadb --no-defaults --protocol=socket -S "$(dir "$n")/mysqld.sock" -uroot \
    --connect-timeout=5 -NB -e "$*"
}
status_var() { sql "$1" "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | cut -f2 || true; }

# The pid of node N's mariadbd, from its pid file (or the one recorded at launch, for
# a node that has not written its pid file yet, e.g. during SST); empty if not running.
# The command line must name this node's configuration, so a recycled pid is never ours.
pid_of() {
  local n=$1 f pid
  for f in "$(dir "$n")/mysqld.pid" "$(dir "$n")/launch.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    if grep -qsaF -- "--defaults-file=$(dir "$n")/my.cnf" "/proc/$pid/cmdline"; then
      echo "$pid"
      return 0
    fi
  done
}
running() { [ -n "$(pid_of "$1")" ]; }
# RSS in MB, and its anonymous part (the rest is mostly the mmapped gcache file).
rss_mb() {
  awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 }
    END { printf "%dMB (anon %dMB)", r / 1024, a / 1024 }' "/proc/$1/status" 2>/dev/null || echo '?'
}

write_config() {
  local n=$1 d gp
  d=$(dir "$n")
  gp=$(galera_port "$n")
  cat >"$d/my.cnf" <<EOF
# Written by .ci/galera.sh start/restart; rewritten at each start.
[mysqld]
datadir = $d/data
socket = $d/mysqld.sock
pid-file = $d/mysqld.pid
log-error = $d/error.log
port = $(client_port "$n")
bind-address = 127.0.0.1
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 300

# What Galera requires.
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2

# Small memory: three of these run beside cargo builds (an earlier attempt saw nodes
# grow to 11 and 23 GB and get OOM-killed). Caches that matter little for tests go
# down; the performance schema and the query cache stay off.
innodb_buffer_pool_size = 128M
innodb_log_file_size = 64M
innodb_log_buffer_size = 8M
key_buffer_size = 8M
aria_pagecache_buffer_size = 8M
query_cache_type = 0
query_cache_size = 0
performance_schema = OFF
table_open_cache = 512
table_definition_cache = 512
thread_cache_size = 32
tmp_table_size = 16M
max_heap_table_size = 16M
# Durability comes from the other nodes; a test cluster need not fsync every commit.
innodb_flush_log_at_trx_commit = 2

wsrep_on = ON
wsrep_provider = $provider
wsrep_cluster_name = task-dedup-galera
wsrep_cluster_address = $cluster_address
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1:$gp
wsrep_node_incoming_address = 127.0.0.1:$(client_port "$n")
# Ports of their own per node (all three share one host). gcache 256M: a node killed
# for a few seconds under the tests' load rejoins by IST (its missed write-sets are
# still cached on a donor) instead of copying the whole datadir again; gcache pages
# (beyond the ring buffer) are dropped as soon as they are released. Failure detection
# shorter than Galera's defaults (suspect 5 s, inactive 15 s, made for real networks):
# writes stall until a killed node is dropped, and a node restarted right after being
# killed waits until its former self has been. Not lower: the nodes share 2 cores with
# builds, and a node late with its keepalives must not be taken for dead.
wsrep_provider_options = "base_host=127.0.0.1;base_port=$gp;gmcast.listen_addr=tcp://127.0.0.1:$gp;ist.recv_addr=127.0.0.1:$((gp + 1));gcache.size=256M;gcache.page_size=64M;gcache.keep_pages_size=0;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S;evs.install_timeout=PT5S"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$((gp + 2))
wsrep_slave_threads = 2
EOF
  chown mysql:mysql "$d/my.cnf"
}

# A datadir for node N if it has none yet. Nodes 2 and 3 get node 1's data by SST
# when they first join, but mariadbd wants a datadir to start from.
init_node() {
  local n=$1 d
  d=$(dir "$n")
  mkdir -p "$d"
  chown mysql:mysql "$d"
  write_config "$n"
  [ -d "$d/data/mysql" ] && return 0
  say "node $n: mariadb-install-db in $d/data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$d/data" \
    --auth-root-authentication-method=socket --skip-test-db >"$d/install-db.log" 2>&1 ||
    { tail -n 20 "$d/install-db.log" >&2; die "node $n: mariadb-install-db failed"; }
}

# Node N's last committed position (uuid:seqno), from grastate.dat after a clean
# shutdown, else (killed: seqno -1 there) recovered from InnoDB with --wsrep-recover;
# empty for a datadir never started. mariadbd started by hand does not do this itself
# (mysqld_safe and the systemd unit do): without a position, a node that was killed
# asks for a full SST although the donor's gcache could send it the missed write-sets.
position() {
  local n=$1 d g uuid seqno pos
  d=$(dir "$n")
  g=$d/data/grastate.dat
  [ -f "$g" ] || return 0
  uuid=$(awk '/^uuid:/ { print $2 }' "$g")
  seqno=$(awk '/^seqno:/ { print $2 }' "$g")
  if [ -n "$uuid" ] && [ "${seqno:--1}" != -1 ]; then
    echo "$uuid:$seqno"
    return 0
  fi
  # Watched, not waited for: once, after a kill under the tests' load, the recovering
  # mariadbd printed its position and then kept running, its RSS growing past 15 GB
  # in two minutes. It is stopped as soon as the position is in its log (60 s at most).
  rm -f "$d/recover.log"
  "$mariadbd" --defaults-file="$d/my.cnf" --user=mysql --wsrep-recover \
    --log-error="$d/recover.log" </dev/null >/dev/null 2>&1 &
  local recover=$! waited=0
  while kill -0 "$recover" 2>/dev/null && [ "$waited" -lt 600 ] &&
    ! grep -q 'Recovered position: ' "$d/recover.log" 2>/dev/null; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -9 "$recover" 2>/dev/null || true
  wait "$recover" 2>/dev/null || true
  pos=$(grep -o 'Recovered position: .*' "$d/recover.log" 2>/dev/null | tail -n 1 || true)
  pos=${pos#Recovered position: }
  case "$pos" in
    00000000-0000-0000-0000-000000000000:* | '') ;;
    *) echo "$pos" ;;
  esac
}

# Starts node N in the background; extra arguments go to mariadbd (--wsrep-new-cluster).
# setsid and no inherited descriptors: it must outlive this script and not hold the
# pipe of the caller's $(...) open. MALLOC_ARENA_MAX bounds glibc's per-thread arenas,
# the usual way a busy mariadbd's RSS creeps far beyond its configured caches.
launch() {
  local n=$1 d pos
  shift
  d=$(dir "$n")
  rm -f "$d/mysqld.pid" "$d/launch.pid"
  pos=$(position "$n")
  [ -z "$pos" ] || set -- --wsrep-start-position="$pos" "$@"
  MALLOC_ARENA_MAX=2 setsid "$mariadbd" --defaults-file="$d/my.cnf" --user=mysql "$@" \
    </dev/null >>"$d/stdout.log" 2>&1 &
  echo $! >"$d/launch.pid"
}

# Waits until node N is Synced and ready and sees a cluster of $2 nodes; fails at the
# deadline (an absolute $SECONDS) or if the node dies, with the end of its error log.
wait_synced() {
  local n=$1 want=$2 deadline=$3 state ready size
  while :; do
    if ! running "$n"; then
      tail -n 30 "$(dir "$n")/error.log" >&2 || true
      die "node $n: mariadbd exited (its error log is above, full log in $(dir "$n")/error.log)"
    fi
    state=$(status_var "$n" wsrep_local_state_comment)
    ready=$(status_var "$n" wsrep_ready)
    size=$(status_var "$n" wsrep_cluster_size)
    [ "$state" = Synced ] && [ "$ready" = ON ] && [ "${size:-0}" -ge "$want" ] && return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$(dir "$n")/error.log" >&2 || true
      die "node $n: not Synced with a cluster of $want after ${timeout}s (state=${state:-?} ready=${ready:-?} cluster_size=${size:-?})"
    fi
    sleep 0.5
  done
}

# A running node in the Primary component, if any: the one others can join.
primary_node() {
  local n
  for n in "${nodes[@]}"; do
    running "$n" && [ "$(status_var "$n" wsrep_cluster_status)" = Primary ] && { echo "$n"; return 0; }
  done
  return 0
}

# With the whole cluster down: which node may bootstrap it. The one whose grastate.dat
# says safe_to_bootstrap: 1 (the last one cleanly shut down); after an unclean stop
# (all killed), none does: recover each node's last committed position from InnoDB
# (mariadbd --wsrep-recover), take the most advanced and mark it safe, as Galera's
# manual says to do by hand.
bootstrap_node() {
  local n g best=1 best_seqno=-2 seqno pos
  for n in "${nodes[@]}"; do
    g=$(dir "$n")/data/grastate.dat
    [ -f "$g" ] && grep -q '^safe_to_bootstrap: *1' "$g" && { echo "$n"; return 0; }
  done
  [ -f "$(dir 1)/data/grastate.dat" ] || { echo 1; return 0; } # never started
  for n in "${nodes[@]}"; do
    [ -f "$(dir "$n")/data/grastate.dat" ] || continue
    pos=$(position "$n")
    seqno=${pos##*:}
    say "node $n: last position ${pos:-unknown}"
    if [ "${seqno:--1}" -gt "$best_seqno" ]; then best=$n; best_seqno=${seqno:--1}; fi
  done
  say "no node is safe_to_bootstrap (unclean stop): node $best has the latest seqno ($best_seqno)"
  sed -i 's/^safe_to_bootstrap: *0/safe_to_bootstrap: 1/' "$(dir "$best")/data/grastate.dat"
  echo "$best"
}

exports() {
  echo "export TASK_DEDUP_GALERA_URLS=\"$(url 1),$(url 2),$(url 3)\""
  echo "export TASK_DEDUP_GALERA_KILL=\"$self kill\""
  echo "export TASK_DEDUP_GALERA_RESTART=\"$self restart\""
}

cmd_start() {
  local started=$SECONDS deadline=$((SECONDS + timeout)) n boot
  command -v rsync >/dev/null || {
    say "installing rsync (the SST method)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null
  }
  id mysql >/dev/null 2>&1 || die "no mysql user (is MariaDB installed?)"
  # mariadb-install-db takes ~4 s a node: the three side by side.
  local pids=()
  mkdir -p "$base"
  chmod 755 "$base"
  for n in "${nodes[@]}"; do
    running "$n" && continue
    init_node "$n" &
    pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n" || exit 1; done

  boot=$(primary_node)
  if [ -z "$boot" ]; then
    for n in "${nodes[@]}"; do
      running "$n" && die "node $n runs but is not in a Primary component: run stop, then start"
    done
    boot=$(bootstrap_node)
    say "node $boot: bootstrapping a new cluster"
    launch "$boot" --wsrep-new-cluster
    wait_synced "$boot" 1 "$deadline"
  fi
  # One at a time: each first join copies a donor's datadir (rsync SST), and a donor
  # serves one joiner at a time anyway.
  for n in "${nodes[@]}"; do
    running "$n" && continue
    say "node $n: joining"
    launch "$n"
    wait_synced "$n" 1 "$deadline"
  done
  for n in "${nodes[@]}"; do wait_synced "$n" 3 "$deadline"; done

  # Replicated to all nodes (DDL and account statements run as total-order isolation).
  sql "$boot" "CREATE DATABASE IF NOT EXISTS test;
    CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
    GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
  for n in "${nodes[@]}"; do
    mariadb --no-defaults -h127.0.0.1 -P"$(client_port "$n")" -uroot test -NBe 'SELECT 1' >/dev/null ||
      die "node $n: root cannot connect over TCP to $(url "$n")"
  done
  say "cluster of 3 up in $((SECONDS - started))s: $(url 1) $(url 2) $(url 3)"
  exports
}

cmd_stop() {
  local n pid pids=() i
  # 3, 2, then 1: the last one to leave is the one marked safe_to_bootstrap, so the
  # next start bootstraps from node 1 again.
  for n in 3 2 1; do
    pid=$(pid_of "$n")
    [ -n "$pid" ] || continue
    say "node $n: shutting down (pid $pid)"
    mariadb-admin --no-defaults -S "$(dir "$n")/mysqld.sock" -uroot --connect-timeout=5 \
      shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 120; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      say "node $n: still up after 60 s, kill -9"
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  # Leftovers of this cluster only (a mariadbd without a pid file yet, an SST script
  # and its rsync daemon): those programs, with a file under $base on their command line.
  while read -r pid; do
    grep -qsE '^(mariadbd|rsync|wsrep_sst_.*)$' "/proc/$pid/comm" && pids+=("$pid")
  done < <(grep -lsF -- "$base/" /proc/[0-9]*/cmdline | cut -d/ -f3)
  if [ ${#pids[@]} -gt 0 ]; then
    say "killing leftover processes: ${pids[*]}"
    kill -9 "${pids[@]}" 2>/dev/null || true
  fi
  for n in "${nodes[@]}"; do rm -f "$(dir "$n")/mysqld.pid" "$(dir "$n")/launch.pid"; done
  if [ "${1:-}" = --clean ]; then
    say "removing $base/node{1,2,3}"
    # The node directories only, in case GALERA_DIR names a directory with more in it.
    rm -rf "$base/node1" "$base/node2" "$base/node3"
    rmdir "$base" 2>/dev/null || true
  fi
}

cmd_kill() {
  local n=$1 pid
  pid=$(pid_of "$n")
  [ -n "$pid" ] || die "node $n is not running"
  kill -9 "$pid"
  say "node $n: killed (pid $pid)"
}

cmd_restart() {
  local n=$1 d log_from started deadline peer how
  d=$(dir "$n")
  if running "$n"; then
    say "node $n: already running"
    wait_synced "$n" 3 $((SECONDS + timeout))
    return 0
  fi
  # Never bootstrap here: a second cluster beside the first would split the data.
  peer=$(primary_node)
  [ -n "$peer" ] || die "no node of the cluster is up (Primary): use '$self start', which picks the node to bootstrap from"
  write_config "$n"
  log_from=$(($(stat -c %s "$d/error.log" 2>/dev/null || echo 0) + 1))
  started=$SECONDS
  deadline=$((SECONDS + timeout))
  # Just killed, node N still counts in the others' view for a few seconds (until
  # evs.suspect_timeout). A new instance started meanwhile is kept out until the
  # view changes twice (~13 s in all, against ~8 s when waiting for the first).
  if [ "$(status_var "$peer" wsrep_cluster_size)" = 3 ]; then
    say "node $n: waiting until the cluster drops its killed instance"
    while [ "$(status_var "$peer" wsrep_cluster_size)" = 3 ]; do
      [ "$SECONDS" -lt "$deadline" ] || die "node $n: the cluster still counts 3 nodes after ${timeout}s"
      sleep 0.5
    done
  fi
  say "node $n: rejoining the cluster (node $peer is up, Primary)"
  launch "$n"
  wait_synced "$n" 3 "$deadline"
  # The joiner's log says how it caught up: the rsync script logs "rsync SST completed"
  # after copying the datadir, "rsync IST completed" when it stepped aside for an IST
  # (MariaDB logs "Installed new state from SST" in both cases).
  how=$(tail -c +"$log_from" "$d/error.log" | awk '
    /rsync SST completed on joiner/ { sst = 1 }
    /rsync IST completed on joiner|IST received: / { ist = 1 }
    /State transfer required/ { req = 1 }
    END {
      if (sst) print "SST"; else if (ist) print "IST"
      else if (req) print "state transfer of unknown kind"; else print "no state transfer"
    }')
  say "node $n: Synced, cluster of 3 again, in $((SECONDS - started))s ($how)"
}

cmd_status() {
  local n pid size=
  for n in "${nodes[@]}"; do
    running "$n" && { size=$(status_var "$n" wsrep_cluster_size); [ -n "$size" ] && break; }
  done
  echo "cluster_size=${size:-0}"
  for n in "${nodes[@]}"; do
    pid=$(pid_of "$n")
    if [ -z "$pid" ]; then
      echo "node$n port=$(client_port "$n") down"
    else
      echo "node$n port=$(client_port "$n") pid=$pid state=$(status_var "$n" wsrep_local_state_comment) rss=$(rss_mb "$pid")"
    fi
  done
}

node_arg() {
  case "${1:-}" in
    1 | 2 | 3) ;;
    *) die "node must be 1, 2 or 3" ;;
  esac
}

[ "$(id -u)" = 0 ] || die "run as root (the nodes run as mysql, their datadirs are chowned to it)"
case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop "${2:-}" ;;
  kill) node_arg "${2:-}" && cmd_kill "$2" ;;
  restart) node_arg "${2:-}" && cmd_restart "$2" ;;
  status) cmd_status ;;
  *)
    say "usage: $0 start | stop [--clean] | kill N | restart N | status"
    exit 2
    ;;
esac
