#!/bin/sh
# The walkthrough's throwaway MariaDB server (mariadb.Dockerfile), with the
# environment of the official image:
#   MARIADB_USER, MARIADB_PASSWORD  a user to create, who may connect from
#                      anywhere (required)
#   MARIADB_DATABASE   a database to create, on which the user gets all
#                      privileges (optional)
# On the first start (no /var/lib/mysql/mysql) it runs mariadb-install-db,
# then mariadbd on all addresses with the arguments given (e.g.
# --innodb-buffer-pool-size=32M). root has no password and cannot log in;
# the container's own user (nonroot) is an administrator over the socket
# in /run/mysqld only, that is from inside the container:
# kubectl exec ... -- mariadb DATABASE.
set -eu

case "${1:-}" in
  -h | --help)
    awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"
    exec mariadbd --help
    ;;
esac

: "${MARIADB_USER:?must be set: the user to create}"
: "${MARIADB_PASSWORD:?must be set: the password of MARIADB_USER}"
datadir=/var/lib/mysql
me="$(id -un)"

if [ ! -d "$datadir/mysql" ]; then
  echo "mariadb-entrypoint: mariadb-install-db $datadir (administrator: $me over the socket)" >&2
  mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=socket \
    --auth-root-socket-user="$me" --skip-test-db --skip-name-resolve --force >&2
fi

# SQL string literals: backslashes and quotes escaped.
quote() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e "s/'/\\\\'/g"; }
user="$(quote "$MARIADB_USER")"
init=/run/mysqld/init.sql
(
  umask 077
  # (printf, not echo: dash's echo would undo the escaping.)
  {
    printf "CREATE USER IF NOT EXISTS '%s'@'%%' IDENTIFIED BY '%s';\n" "$user" "$(quote "$MARIADB_PASSWORD")"
    if [ -n "${MARIADB_DATABASE:-}" ]; then
      printf 'CREATE DATABASE IF NOT EXISTS `%s`;\n' "$MARIADB_DATABASE"
      printf "GRANT ALL ON \`%s\`.* TO '%s'@'%%';\n" "$MARIADB_DATABASE" "$user"
    fi
  } >"$init"
)

exec mariadbd --datadir="$datadir" --bind-address=0.0.0.0 --skip-name-resolve \
  --init-file="$init" "$@"
