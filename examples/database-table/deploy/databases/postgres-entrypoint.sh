#!/bin/sh
# The walkthrough's throwaway PostgreSQL server (postgres.Dockerfile), with
# the environment of the official image:
#   POSTGRES_PASSWORD  the password of POSTGRES_USER (required)
#   POSTGRES_USER      the superuser to create (default postgres)
#   POSTGRES_DB        a database to create (default POSTGRES_USER)
#   PGDATA             the data directory (default in the image:
#                      /var/lib/postgresql/data/pgdata; its parent must be writable)
# On the first start (PGDATA without PG_VERSION) it runs initdb, then
# `postgres -c listen_addresses=*` with the arguments given (e.g. -c
# shared_buffers=16MB). Password (scram-sha-256) over TCP from anywhere; no
# password over the socket in /var/run/postgresql, that is from inside the
# container: kubectl exec ... -- psql -U USER DATABASE.
set -eu

case "${1:-}" in
  -h | --help)
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"
    exec postgres --help
    ;;
esac

: "${POSTGRES_PASSWORD:?must be set: the password of POSTGRES_USER}"
: "${PGDATA:?must be set: the data directory}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  echo "postgres-entrypoint: initdb $PGDATA (superuser $user, database $db)" >&2
  mkdir -p "$PGDATA"
  chmod 0700 "$PGDATA"
  pwfile="$PGDATA/../.pwfile.$$"
  (umask 077 && printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile")
  initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >&2
  rm -f "$pwfile"
  echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    # Single-user mode: no server listens yet. (Simple names only: it is
    # quoted, not escaped.)
    printf 'CREATE DATABASE "%s";\n' "$db" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
fi

exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
