#!/usr/bin/env bash
# Starts and stops a private, throwaway PostgreSQL server for tests, in any
# language: its own data directory, TCP on 127.0.0.1 only, its Unix socket
# inside DIR, trust authentication, and no durability (fsync off).
#
#   hack/postgres.sh start DIR [PORT]  prints the DSN, e.g. postgresql://postgres@127.0.0.1:PORT/postgres
#   hack/postgres.sh dsn DIR           prints the DSN of the server in DIR
#   hack/postgres.sh stop DIR          stops the server; deleting DIR is up to the caller
#
# start creates DIR (which must be absent or empty) and initializes it on
# first use, and is idempotent: a server already running in DIR is left alone
# and its DSN printed. PORT defaults to (and 0 means) a free port. stdout carries the DSN
# only; progress and errors go to stderr, the server's log to DIR/postgres.log.
#
# PostgreSQL refuses to run as root, so as root the server runs as
# $KPLUG_PG_USER (default: nobody), who must be able to reach DIR: use a
# directory under /tmp, not one inside a private (0700) directory such as
# pytest's tmp_path. Server binaries come from $PG_BIN, else initdb on PATH,
# else the newest /usr/lib/postgresql/*/bin (Debian's postgresql package).
set -euo pipefail

die() {
  echo "postgres.sh: $*" >&2
  exit 1
}

usage() {
  echo "usage: $0 start DIR [PORT] | dsn DIR | stop DIR" >&2
  exit 2
}

bin_dir() {
  if [[ -n "${PG_BIN:-}" ]]; then
    echo "$PG_BIN"
    return
  fi
  local initdb dir
  if initdb="$(command -v initdb)"; then
    # pg_ctl finds postgres beside itself, so resolve Debian's symlinks.
    dirname "$(readlink -f "$initdb")"
    return
  fi
  for dir in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
    if [[ -x "$dir/initdb" ]]; then
      echo "$dir"
      return
    fi
  done
  die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: apt-get install postgresql, or set PG_BIN"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

dsn() {
  local port
  port="$(sed -n 's/^port = //p' "$dir/data/kplug.conf" 2>/dev/null)" || true
  [[ -n "$port" ]] || die "no server configured in $dir"
  echo "postgresql://postgres@127.0.0.1:$port/postgres"
}

running() {
  [[ -f "$dir/data/PG_VERSION" ]] && as_user "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1
}

initialize() {
  mkdir -p "$dir"
  [[ -z "$(ls -A "$dir")" ]] || die "$dir is neither empty nor a PostgreSQL directory made by this script"
  if [[ "$(id -u)" -eq 0 ]]; then
    chown "$user" "$dir"
  fi
  chmod 700 "$dir"
  as_user test -w "$dir" ||
    die "user $user cannot write to $dir: every parent directory must be searchable by $user (try one under /tmp)"
  echo "== initializing a PostgreSQL server in $dir" >&2
  as_user "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C --no-sync \
    >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    die "initdb failed"
  }
  echo "include_if_exists = 'kplug.conf'" >>"$dir/data/postgresql.conf"
}

start() {
  local port="$1" attempt
  if running; then
    dsn
    return
  fi
  [[ -f "$dir/data/PG_VERSION" ]] || initialize
  # Without an explicit port, a free one may be taken before the server
  # binds it: try another.
  for attempt in 1 2 3; do
    cat >"$dir/data/kplug.conf" <<EOF
listen_addresses = '127.0.0.1'
port = ${port:-$(free_port)}
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    if [[ "$(id -u)" -eq 0 ]]; then
      chown "$user" "$dir/data/kplug.conf"
    fi
    if as_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start >/dev/null; then
      dsn
      return
    fi
    [[ -z "$port" ]] || break
    echo "postgres.sh: start attempt $attempt failed; retrying on another port" >&2
  done
  tail -n 20 "$dir/postgres.log" >&2 || true
  die "PostgreSQL did not start in $dir"
}

stop() {
  if running; then
    as_user "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
  fi
}

[[ $# -ge 2 ]] || usage
command="$1"
dir="$(realpath -m "$2")"
bin="$(bin_dir)"
if [[ "$(id -u)" -eq 0 ]]; then
  user="${KPLUG_PG_USER:-nobody}"
  as_user() { (cd "$dir" && runuser -u "$user" -- "$@"); }
else
  user="$(id -un)"
  as_user() { (cd "$dir" && "$@"); }
fi

case "$command" in
start)
  [[ $# -le 3 ]] || usage
  port="${3:-0}"
  [[ "$port" =~ ^[0-9]+$ && "$port" -le 65535 ]] || die "port must be a number from 0 to 65535, not $port"
  start "${port##0}"
  ;;
dsn)
  [[ $# -eq 2 ]] || usage
  dsn
  ;;
stop)
  [[ $# -eq 2 ]] || usage
  [[ ! -d "$dir" ]] || stop
  ;;
*) usage ;;
esac
