#!/usr/bin/env bash
# Client-side instructions per call, counted with callgrind: for each dialect, workload
# and strategy, (Ir at 5,000 calls - Ir at 1,000 calls) / 4,000, so that start-up,
# migrations and warm-up cancel out. One client, pool of 4. Prints one line per cell:
#   <dialect> <workload> <strategy> total=<Ir/call> mem=<memcpy+memset> alloc=<malloc/free> rest=<the others>
#
#   bench/profile.sh                           # builds the bench with line tables first
#   PROFILE_BIN=/abs/path/other-build bench/profile.sh   # a binary built elsewhere (A/B)
#
# Environment: the BENCH_*_URL variables of bench/run.sh, PROFILE_DIALECTS ("sqlite
# postgres mysql"), PROFILE_WORKLOADS ("unique dup"), PROFILE_STRATEGIES ("raw-dedup
# find-or-enqueue"). Needs valgrind, and glibc's symbols (`mem` and `alloc` match its
# source file names; without them they read 0). Callgrind counts every iteration of a
# `rep movsb`, so `mem` weighs more here than in wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

sqlite_url=${BENCH_SQLITE_URL:-"sqlite:///tmp/task-dedup-profile.db?mode=rwc"}
postgres_url=${BENCH_POSTGRES_URL:-"postgres://postgres@127.0.0.1:5432/task_dedup_bench?sslmode=disable"}
mysql_url=${BENCH_MYSQL_URL:-"mysql://root@127.0.0.1:3306/task_dedup_bench"}

bin=${PROFILE_BIN:-}
if [ -z "$bin" ]; then
  CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo build --quiet --release -p task-dedup-bench
  bin=${CARGO_TARGET_DIR:-target}/release/task-dedup-bench
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Ir of one run: total, memcpy/memset, malloc/free. Fails when the run fails or stops
# short of its calls (the difference per call would be wrong).
count() { # url strategy workload ops
  local line
  rm -f "$work/out"
  line=$(valgrind --tool=callgrind --callgrind-out-file="$work/out" "$bin" --url "$1" \
    --strategy "$2" --workload "$3" --clients 1 --pool 4 --ops "$4" --warmup 500 \
    --deadline-secs 3600 2>/dev/null) || return 1
  line=${line%%$'\n'*}
  [ "$(cut -d' ' -f3 <<<"$line")" = "$4" ] || { echo "run stopped short: $line" >&2; return 1; }
  callgrind_annotate --threshold=100 --auto=no "$work/out" | awk '
    /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
    /(memmove|memset)-vec-unaligned-erms.S:__mem/ { gsub(",", "", $1); mem += $1 }
    /malloc.c:/ { gsub(",", "", $1); alloc += $1 }
    END { print total, mem + 0, alloc + 0 }'
}

for dialect in ${PROFILE_DIALECTS:-sqlite postgres mysql}; do
  case $dialect in
    sqlite) url=$sqlite_url ;;
    postgres) url=$postgres_url ;;
    mysql) url=$mysql_url ;;
    *) echo "unknown dialect $dialect" >&2; exit 1 ;;
  esac
  for workload in ${PROFILE_WORKLOADS:-unique dup}; do
    for strategy in ${PROFILE_STRATEGIES:-raw-dedup find-or-enqueue}; do
      small=$(count "$url" "$strategy" "$workload" 1000) || exit 1
      large=$(count "$url" "$strategy" "$workload" 5000) || exit 1
      read -r t1 m1 a1 <<<"$small"
      read -r t2 m2 a2 <<<"$large"
      echo "$dialect $workload $strategy total=$(((t2 - t1) / 4000)) mem=$(((m2 - m1) / 4000))" \
        "alloc=$(((a2 - a1) / 4000)) rest=$(((t2 - t1 - m2 + m1 - a2 + a1) / 4000))"
    done
  done
done
