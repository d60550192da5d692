# What hack/walkthrough.sh (processes on loopback) and
# hack/walkthrough-cluster.sh (pods on the real cluster) share: progress
# output, the usage text, the story's objects and the check of its result.
# Source it.
# shellcheck shell=bash disable=SC2034 # the variables are for the scripts that source it

step() { echo "== $*" >&2; }
note() { echo "   $*" >&2; }

# usage [STATUS]: the running script's header comment, then exit (2: a usage error).
usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2
  exit "${1:-2}"
}

# The database and table the walkthrough makes (examples/database-table/users.yaml).
WALKTHROUGH_DATABASE=tables
WALKTHROUGH_TABLE=users
WALKTHROUGH_COLUMNS=id,name
# users' columns as MariaDB has them, comma-separated in order.
WALKTHROUGH_COLUMNS_SQL="SELECT GROUP_CONCAT(column_name ORDER BY ordinal_position)
  FROM information_schema.columns WHERE table_schema = '$WALKTHROUGH_DATABASE' AND table_name = '$WALKTHROUGH_TABLE'"

# Patches and objects the hints suggest.
WALKTHROUGH_ADD_EMAIL='{"spec":{"columns":[{"name":"id","type":"uint64"},{"name":"name","type":"string"},{"name":"email","type":"string"}]}}'
WALKTHROUGH_EMAIL_TEXT='{"spec":{"columns":[{"name":"id","type":"uint64"},{"name":"name","type":"string"},{"name":"email","type":"text"}]}}'
WALKTHROUGH_ACCOUNTS='{"apiVersion":"myorg.org/v1alpha1","kind":"DatabaseTable","metadata":{"name":"accounts"},"spec":{"serverName":"accounts-db","preferredImplementation":"PostgreSQL","columns":[{"name":"id","type":"uint64"},{"name":"owner","type":"string"}]}}'

# check_result IMPLEMENTATION COLUMNS: what the DatabaseTable's status says
# and what MariaDB has are the walkthrough's end; calls fail otherwise.
check_result() {
  [ "$1" = MariaDB ] || fail "status.implementation is '$1', not MariaDB"
  [ "$2" = "$WALKTHROUGH_COLUMNS" ] ||
    fail "MariaDB's table $WALKTHROUGH_TABLE has the columns '$2', not '$WALKTHROUGH_COLUMNS'"
  note "ok: status.implementation=MariaDB, columns $2"
}
