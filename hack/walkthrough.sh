#!/usr/bin/env bash
# The DatabaseTable walkthrough (examples/database-table) in one command, on
# this machine, with no container runtime: a real control plane (etcd and
# kube-apiserver, hack/control-plane.sh), kplug installed in it as an
# aggregated API server the way deploy/ and apiservice/ ship it, a private
# PostgreSQL and MariaDB, both plugins heartbeating to kplug as their own
# ServiceAccounts, and the zero-code kplug-operator reconciling the
# DatabaseTable `users` (examples/database-table/users.yaml) into a MariaDB
# table (its preferred implementation). Everything listens on 127.0.0.1.
#
#   hack/walkthrough.sh           # set up, show the result and what to try next, then
#                                 # wait for Ctrl-C (or SIGTERM), clean up and exit 0
#   hack/walkthrough.sh --check   # set up, verify, clean up; exit 0 on success (for tests)
#   hack/walkthrough.sh --cluster [--check]
#                                 # the same story with pods on a real single-node
#                                 # Kubernetes on this machine: hack/walkthrough-cluster.sh
#
# It runs hack/setup.sh first (kubectl, PostgreSQL, MariaDB, the Python
# virtualenv, kube-apiserver; slow only the first time), then builds
# kplug-apiserver, kplug-operator and the MariaDB plugin with cargo.
# Progress goes to stderr ("== step"), what it shows to stdout.
#
# Environment:
#   KPLUG_WALKTHROUGH_DIR      where everything lives: the control plane,
#       certificates, tokens, kubeconfigs (DIR/admin.kubeconfig), databases,
#       PID files (DIR/*.pid) and logs (DIR/*.log). Must be absent, empty or
#       left by an earlier walkthrough (then it is wiped), and reachable by
#       the user "nobody" when run as root (PostgreSQL runs as nobody): use
#       one under /tmp. Default: a new /tmp/kplug-walkthrough.XXXXXX,
#       removed on exit, except after a failure (for its logs). A DIR given
#       here is never removed.
#   KPLUG_WALKTHROUGH_PROFILE  release (default) or debug: the cargo profile
#       to build and run (debug is quicker to build; the tests use it).
#   KPLUG_WALKTHROUGH_KEEP=1   keep the default DIR on exit.
#   KPLUG_VENV                 the Python virtualenv (default ~/.cache/kplug/venv).
#
# Tokens (TokenRequest, no controller-manager runs here) last 24 hours: an
# interactive session longer than that loses its plugins and operator.
# On any failure it prints the tails of the logs, stops everything it
# started and exits non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "${1:-}" != --cluster ] || exec "$ROOT/hack/walkthrough-cluster.sh" "${@:2}"
# shellcheck source=hack/lib/walkthrough.sh
. "$ROOT/hack/lib/walkthrough.sh"
KUBECTL=/usr/bin/kubectl
EXAMPLE="$ROOT/examples/database-table"
VENV="${KPLUG_VENV:-$HOME/.cache/kplug/venv}"
PROFILE="${KPLUG_WALKTHROUGH_PROFILE:-release}"
TOKEN_SECONDS=86400
PG_PLUGIN=database-table-postgresql-plugin
MARIADB_PLUGIN=database-table-mariadb-plugin
OPERATOR_SA=database-table-operator
MARIADB_DATABASE="$WALKTHROUGH_DATABASE"
MARIADB_USER=tables
MARIADB_PASSWORD=walkthrough-password
MARKER=.kplug-walkthrough

CHECK=""
DIR=""
MADE_DIR=""   # DIR is ours to delete
STARTED=()    # "NAME PID" of the processes this script started, in start order
CP_STARTED=""
PG_STARTED=""
FAILED_LOGS_SHOWN=""
CLEANED=""
INTERRUPTED=""  # Ctrl-C or SIGTERM
WAITING=""      # set up and waiting for Ctrl-C: an interrupt is the normal end

# show_logs: the last lines of every log, for a failure.
show_logs() {
  FAILED_LOGS_SHOWN=1
  [ -n "$DIR" ] && [ -d "$DIR" ] || return 0
  local f
  for f in "$DIR"/*.log; do
    [ -s "$f" ] || continue
    echo "--- last 25 lines of $f ---" >&2
    tail -n 25 "$f" >&2
  done
}

# fail MESSAGE: print it and the logs' tails, then exit (the EXIT trap cleans
# up). In a subshell ($(...)), only the message: the script then fails and
# its EXIT trap shows the logs.
fail() {
  echo "walkthrough: FAILED: $*" >&2
  [ "$BASH_SUBSHELL" -gt 0 ] || show_logs
  exit 1
}

k() { "$KUBECTL" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ours PID: PID runs (not a zombie) and is still a child of this shell (not
# a reused PID).
ours() {
  local ppid stat
  read -r ppid stat < <(ps -o ppid=,stat= -p "$1" 2>/dev/null) || return 1
  [ "$ppid" = "$$" ] && [ "${stat:0:1}" != Z ]
}

# pid_of NAME: the PID of a process this script started.
pid_of() {
  local entry
  for entry in "${STARTED[@]}"; do
    [ "${entry%% *}" = "$1" ] && { echo "${entry#* }"; return 0; }
  done
  return 1
}

# start_bg NAME LOG COMMAND...: runs COMMAND in the background in its own
# session (Ctrl-C reaches only this script, which then stops everything in
# order), stdout and stderr to LOG; records its PID in DIR/NAME.pid.
start_bg() {
  local name="$1" log="$2"
  shift 2
  setsid "$@" </dev/null >"$log" 2>&1 &
  local pid=$!
  STARTED+=("$name $pid")
  echo "$pid" >"$DIR/$name.pid"
  note "$name: pid $pid, log $log"
}

# alive NAME: fails with its log when the process NAME has exited.
alive() {
  local pid
  pid="$(pid_of "$1")"
  ours "$pid" || fail "$1 (pid $pid) exited"
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every half second until it
# succeeds; fails after SECONDS. WATCH (names of started processes) are
# checked to be alive meanwhile.
WATCH=()
wait_for() {
  local seconds="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + seconds)) name
  while :; do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    for name in "${WATCH[@]}"; do alive "$name"; done
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "walkthrough: last attempt at '$what':" >&2
      "$@" >&2 || true
      fail "$what: not within ${seconds}s"
    fi
    sleep 0.5
  done
}

# stop_pid NAME PID SECONDS: SIGTERM, then SIGKILL after SECONDS.
stop_pid() {
  local name="$1" pid="$2" seconds="$3" i
  ours "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < seconds * 10; i++)); do
    ours "$pid" || break
    sleep 0.1
  done
  if ours "$pid"; then
    note "$name ($pid) ignored SIGTERM for ${seconds}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  note "stopped $name ($pid)"
}

cleanup() {
  local rc=$?
  [ -z "$CLEANED" ] || return 0
  CLEANED=1
  trap '' INT TERM
  set +e
  if [ -n "$INTERRUPTED" ]; then
    if [ -n "$WAITING" ]; then rc=0; else echo "walkthrough: interrupted" >&2; fi
  elif [ "$rc" -ne 0 ] && [ -z "$FAILED_LOGS_SHOWN" ]; then
    echo "walkthrough: FAILED (exit $rc)" >&2
    show_logs
  fi
  step "cleaning up"
  # The operator first (it stops delegating), then the plugins (they
  # deregister from kplug), kplug, the databases and the control plane.
  local name pid
  for name in operator postgresql-plugin mariadb-plugin kplug mariadbd; do
    pid="$(pid_of "$name")" || continue
    stop_pid "$name" "$pid" 30
  done
  [ -z "$PG_STARTED" ] || "$ROOT/hack/postgres.sh" stop "$DIR/postgres" || true
  [ -z "$CP_STARTED" ] || "$ROOT/hack/control-plane.sh" stop "$DIR" || true
  if [ -n "$MADE_DIR" ]; then
    if { [ "$rc" -eq 0 ] || [ -n "$INTERRUPTED" ]; } && [ -z "${KPLUG_WALKTHROUGH_KEEP:-}" ]; then
      rm -rf "$DIR"
    else
      note "kept $DIR (logs: $DIR/*.log)"
    fi
  fi
  exit "$rc"
}

# --- steps --------------------------------------------------------------------

prepare_dir() {
  if [ -n "${KPLUG_WALKTHROUGH_DIR:-}" ]; then
    local dir
    dir="$(realpath -m "$KPLUG_WALKTHROUGH_DIR")"
    mkdir -p "$dir"
    if [ -n "$(ls -A "$dir")" ]; then
      # (DIR stays unset until checked: a failure here shows no logs of it.)
      [ -f "$dir/$MARKER" ] || fail "$dir is not empty and was not made by hack/walkthrough.sh"
      if "$ROOT/hack/control-plane.sh" status "$dir" 2>/dev/null; then
        fail "a walkthrough still runs in $dir (its control plane is up)"
      fi
      note "wiping the earlier walkthrough in $dir"
      find "$dir" -mindepth 1 -delete
    fi
    DIR="$dir"
  else
    DIR="$(mktemp -d /tmp/kplug-walkthrough.XXXXXX)"
    MADE_DIR=1
  fi
  # As root, PostgreSQL runs as nobody, who must reach DIR/postgres.
  chmod 755 "$DIR"
  touch "$DIR/$MARKER"
  note "working directory: $DIR"
}

setup_machine() {
  step "1/8 hack/setup.sh: the tools the walkthrough needs"
  "$ROOT/hack/setup.sh"
  [ -x "$KUBECTL" ] || fail "$KUBECTL not found"
  [ -x "$VENV/bin/python" ] || fail "no Python virtualenv at $VENV (hack/python-env.sh makes it)"
}

build() {
  local flags=(--locked -p kplug-apiserver -p kplug-operator -p kplug-example-mariadb-plugin)
  case "$PROFILE" in
    release) flags+=(--release) ;;
    debug) ;;
    *) fail "KPLUG_WALKTHROUGH_PROFILE must be release or debug, not '$PROFILE'" ;;
  esac
  step "1/8 cargo build ${flags[*]}"
  (cd "$ROOT" && cargo build "${flags[@]}") || fail "cargo build failed"
  local target
  target="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
  BIN="$target/$PROFILE"
  local binary
  for binary in kplug-apiserver kplug-operator mariadb-plugin; do
    [ -x "$BIN/$binary" ] || fail "$BIN/$binary missing after the build"
  done
}

start_control_plane() {
  step "2/8 a real control plane (etcd + kube-apiserver): hack/control-plane.sh start $DIR"
  CP_STARTED=1
  "$ROOT/hack/control-plane.sh" start "$DIR" >/dev/null || fail "the control plane did not start"
  # shellcheck disable=SC1091
  . "$DIR/env"
  export -n KUBECONFIG # the processes started here get explicit kubeconfigs
  note "kube-apiserver $KPLUG_APISERVER_VERSION at $KPLUG_APISERVER_URL"
}

# token NAMESPACE SERVICEACCOUNT FILE [AUDIENCE]: a TokenRequest token into
# FILE, for AUDIENCE (default: kube-apiserver's own).
token() {
  local request="$DIR/token-request.json" answer audiences=""
  [ -z "${4:-}" ] || audiences=", \"audiences\": [\"$4\"]"
  printf '{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": %d%s}}\n' \
    "$TOKEN_SECONDS" "$audiences" >"$request"
  answer="$(k create --raw "/api/v1/namespaces/$1/serviceaccounts/$2/token" -f "$request")" ||
    fail "TokenRequest for $1/$2 failed"
  (umask 077 && python3 -c 'import json, sys; print(json.load(sys.stdin)["status"]["token"])' \
    <<<"$answer" >"$3")
}

# token_kubeconfig TOKEN_FILE OUT: a kubeconfig that authenticates with the token.
token_kubeconfig() {
  (
    umask 077
    cat >"$2" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: walkthrough
  cluster:
    server: $KPLUG_APISERVER_URL
    certificate-authority: $KPLUG_CA_CERT
users:
- name: token
  user:
    token: $(cat "$1")
contexts:
- name: walkthrough
  context: {cluster: walkthrough, user: token}
current-context: walkthrough
EOF
  )
}

# apiservice_available: the APIService's Available condition is True.
apiservice_available() {
  k get apiservice v1alpha1.plugins.kplug.io -o json | python3 -c '
import json, sys
conditions = json.load(sys.stdin).get("status", {}).get("conditions", [])
sys.exit(0 if any(c["type"] == "Available" and c["status"] == "True" for c in conditions) else 1)'
}

install_kplug() {
  step "3/8 kplug as an aggregated API server: deploy/, its ServiceAccount, certificates, APIService"
  # The PodDisruptionBudget is policy/v1 (Kubernetes 1.21+); the local
  # kube-apiserver may be older, and there are no pods to disrupt here.
  # Captured first: `grep -q` in a pipe can SIGPIPE kubectl under pipefail.
  local versions; versions="$(k api-versions)" || fail "kubectl api-versions failed"
  if grep -qx policy/v1 <<<"$versions"; then
    k apply -k "$ROOT/deploy" >/dev/null || fail "kubectl apply -k deploy/ failed"
  else
    k kustomize "$ROOT/deploy" | python3 -c '
import sys
documents = sys.stdin.read().split("\n---\n")
print("\n---\n".join(d for d in documents if "kind: PodDisruptionBudget" not in d))
' | k apply -f - >/dev/null || fail "kubectl apply of deploy/ failed"
  fi
  token kplug-system kplug "$DIR/kplug.token"
  token_kubeconfig "$DIR/kplug.token" "$DIR/kplug.kubeconfig"
  CERTS="$DIR/kplug-certs"
  "$BIN/kplug-apiserver" certs --service kplug --namespace kplug-system --out-dir "$CERTS" \
    >"$DIR/kplug-ca-bundle.txt" 2>"$DIR/kplug-certs.log" || fail "kplug-apiserver certs failed"
  KPLUG_HTTPS="$(free_port)"
  KPLUG_GRPC="$(free_port)"
  NO_COLOR=1 start_bg kplug "$DIR/kplug.log" "$BIN/kplug-apiserver" serve \
    --listen "127.0.0.1:$KPLUG_HTTPS" --grpc-listen "127.0.0.1:$KPLUG_GRPC" \
    --tls-cert-file "$CERTS/tls.crt" --tls-private-key-file "$CERTS/tls.key" \
    --kubeconfig "$DIR/kplug.kubeconfig" --min-heartbeat-interval 1s
  WATCH=(kplug)
  wait_for 60 "kplug serving" grep -q "kplug is serving" "$DIR/kplug.log"
  # No pods here: the Service kplug-system/kplug becomes an ExternalName for
  # localhost on kplug's port, and the aggregator proxies to it.
  k -n kplug-system delete service kplug --ignore-not-found >/dev/null
  k apply -f - >/dev/null <<EOF || fail "cannot create the ExternalName Service"
apiVersion: v1
kind: Service
metadata: {name: kplug, namespace: kplug-system}
spec:
  type: ExternalName
  externalName: localhost
  ports:
  - {name: https, port: $KPLUG_HTTPS}
EOF
  "$ROOT/apiservice/render.sh" "$CERTS/ca.crt" kplug kplug-system "$KPLUG_HTTPS" >"$DIR/apiservice.yaml" ||
    fail "apiservice/render.sh failed"
  k apply -f "$DIR/apiservice.yaml" >/dev/null || fail "cannot apply the APIService"
  wait_for 90 "APIService v1alpha1.plugins.kplug.io Available=True" apiservice_available
  # The aggregator's proxy for a new group can lag the Available condition.
  wait_for 30 "plugins.kplug.io served through kube-apiserver" k get --raw /apis/plugins.kplug.io/v1alpha1
  note "kplug: https://localhost:$KPLUG_HTTPS (API), https://localhost:$KPLUG_GRPC (heartbeats)"
}

start_postgres() {
  PG_STARTED=1
  PG_DSN="$("$ROOT/hack/postgres.sh" start "$DIR/postgres")" || fail "PostgreSQL did not start"
  ln -sf postgres/postgres.log "$DIR/postgres.log"
  note "PostgreSQL: $PG_DSN"
}

# find_bin NAME...: the first of NAMEs on PATH or in /usr/sbin.
find_bin() {
  local name
  for name in "$@"; do
    command -v "$name" 2>/dev/null && return 0
    [ -x "/usr/sbin/$name" ] && { echo "/usr/sbin/$name"; return 0; }
  done
  fail "none of $* is installed (hack/setup.sh installs mariadb-server)"
}

# The recipe of test-support/src/mariadb.rs: a private datadir, loopback TCP
# and a socket in DIR, a database and a user for the plugin.
start_mariadb() {
  local mariadbd install_db user_flag=()
  mariadbd="$(find_bin mariadbd mysqld)"
  install_db="$(find_bin mariadb-install-db mysql_install_db)"
  MARIADB_CLIENT="$(find_bin mariadb mysql)"
  MARIADB_SOCKET="$DIR/mariadb/mariadb.sock"
  mkdir -p "$DIR/mariadb"
  # mariadbd refuses to run as root unless told to.
  [ "$(id -u)" -ne 0 ] || user_flag=(--user=root)
  "$install_db" --no-defaults --datadir="$DIR/mariadb/data" --auth-root-authentication-method=normal \
    --skip-test-db "${user_flag[@]}" >"$DIR/mariadb/install-db.log" 2>&1 ||
    fail "mariadb-install-db failed: $(tail -n 20 "$DIR/mariadb/install-db.log")"
  MARIADB_PORT="$(free_port)"
  # Its log: --log-error.
  start_bg mariadbd "$DIR/mariadb/mariadbd.out" "$mariadbd" --no-defaults --datadir="$DIR/mariadb/data" \
    --socket="$MARIADB_SOCKET" --port="$MARIADB_PORT" --bind-address=127.0.0.1 \
    --pid-file="$DIR/mariadb/mariadb.pid" --log-error="$DIR/mariadb.log" \
    --skip-name-resolve --innodb-buffer-pool-size=32M "${user_flag[@]}"
  WATCH=(kplug mariadbd)
  wait_for 60 "MariaDB accepting connections" mariadb_root -e 'SELECT 1'
  mariadb_root -e "CREATE DATABASE $MARIADB_DATABASE;
    CREATE USER '$MARIADB_USER'@'127.0.0.1' IDENTIFIED BY '$MARIADB_PASSWORD';
    CREATE USER '$MARIADB_USER'@'localhost' IDENTIFIED BY '$MARIADB_PASSWORD';
    GRANT ALL ON $MARIADB_DATABASE.* TO '$MARIADB_USER'@'127.0.0.1', '$MARIADB_USER'@'localhost';" ||
    fail "cannot create MariaDB's database and user"
  note "MariaDB: 127.0.0.1:$MARIADB_PORT, database $MARIADB_DATABASE, user $MARIADB_USER"
}

mariadb_root() {
  "$MARIADB_CLIENT" --no-defaults --socket="$MARIADB_SOCKET" --user=root --batch "$@"
}

start_databases() {
  step "4/8 a private PostgreSQL and MariaDB under $DIR"
  start_postgres
  start_mariadb
}

# manifest_objects FILE KIND...: the objects of those kinds in a manifest,
# as a JSON List (read by kubectl, so YAML needs no Python module).
manifest_objects() {
  local file="$1" wanted objects
  shift
  # Only the kinds asked for reach kubectl: the local kube-apiserver may not
  # know the others (1.20 has no policy/v1 PodDisruptionBudget).
  wanted="$(python3 -c '
import re, sys
kinds = set(sys.argv[2:])
documents = re.split(r"(?m)^---[ \t]*$", open(sys.argv[1]).read())
print("\n---\n".join(d for d in documents if set(re.findall(r"(?m)^kind: *(\S+)", d)) & kinds))
' "$file" "$@")" || fail "cannot read $file"
  # --validate=false: kube-apiserver 1.20's schema predates e.g. gRPC probes.
  objects="$(k create --dry-run=client --validate=false -o json -f - <<<"$wanted")" || fail "cannot read $file"
  python3 -c '
import json, re, sys
text, decoder, items, at = sys.stdin.read(), json.JSONDecoder(), [], 0
while (at := re.compile(r"\s*").match(text, at).end()) < len(text):
    doc, at = decoder.raw_decode(text, at)  # one JSON document per object, or a List
    items += doc["items"] if doc.get("kind") == "List" else [doc]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [i for i in items if i["kind"] in sys.argv[1:]]}))
' "$@" <<<"$objects" || fail "cannot parse kubectl's reading of $file"
}

# identity MANIFEST: applies the ServiceAccount and RBAC of a shipped plugin
# manifest (the plugin's heartbeat role, and kplug's read role for its API;
# not its Deployment and Service: nothing runs pods here).
identity() {
  local objects
  objects="$(manifest_objects "$1" ServiceAccount ClusterRole ClusterRoleBinding)"
  [ "$(python3 -c 'import json, sys; print(len(json.load(sys.stdin)["items"]))' <<<"$objects")" = 5 ] ||
    fail "expected a ServiceAccount and two ClusterRoles with their ClusterRoleBindings in $1"
  k apply -f - >/dev/null <<<"$objects" || fail "cannot apply the identity of $1"
}

# plugins_ready NAME...: every named Plugin is listed with Ready=True.
plugins_ready() {
  k get plugins -o json | python3 -c '
import json, sys
ready = {p["metadata"]["name"] for p in json.load(sys.stdin)["items"]
         if any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))}
sys.exit(0 if set(sys.argv[1:]) <= ready else 1)' "$@"
}

start_plugins() {
  step "5/8 the CRDs, the plugins' identities (deploy/*-plugin.yaml) and both plugins heartbeating to kplug"
  k apply -f "$EXAMPLE/deploy/namespace.yaml" >/dev/null || fail "cannot create the namespace plugins"
  k apply -f "$EXAMPLE/crds/" >/dev/null || fail "cannot apply the CRDs"
  k wait --for condition=Established --timeout=60s \
    crd/databasetables.myorg.org crd/databasetablemariadbextensions.myorg.org \
    crd/databasetablepostgresqlextensions.myorg.org >/dev/null || fail "the CRDs are not Established"
  identity "$EXAMPLE/deploy/postgresql-plugin.yaml"
  identity "$EXAMPLE/deploy/mariadb-plugin.yaml"
  # Plugins' tokens are for kplug's registry (its --plugin-token-audience).
  token plugins "$PG_PLUGIN" "$DIR/postgresql-plugin.token" plugins.kplug.io
  token plugins "$MARIADB_PLUGIN" "$DIR/mariadb-plugin.token" plugins.kplug.io
  local registry=(--registry "https://localhost:$KPLUG_GRPC" --registry-ca-file "$CERTS/ca.crt"
    --heartbeat-interval 1s)
  start_bg postgresql-plugin "$DIR/postgresql-plugin.log" "$VENV/bin/python" -m postgresql_plugin \
    "${registry[@]}" --token-file "$DIR/postgresql-plugin.token" \
    --listen "127.0.0.1:$(free_port)" --dsn "$PG_DSN"
  # The URL carries a password: the environment, not the command line.
  MARIADB_URL="mysql://$MARIADB_USER:$MARIADB_PASSWORD@127.0.0.1:$MARIADB_PORT/$MARIADB_DATABASE?prefer_socket=false" \
    NO_COLOR=1 start_bg mariadb-plugin "$DIR/mariadb-plugin.log" "$BIN/mariadb-plugin" \
    "${registry[@]}" --token-file "$DIR/mariadb-plugin.token" --listen "127.0.0.1:$(free_port)"
  WATCH=(kplug mariadbd postgresql-plugin mariadb-plugin)
  wait_for 90 "both plugins Ready in kubectl get plugins" plugins_ready "$PG_PLUGIN" "$MARIADB_PLUGIN"
}

# operator_args: the container args of examples/database-table/deploy/operator.yaml, one a line.
operator_args() {
  manifest_objects "$EXAMPLE/deploy/operator.yaml" Deployment | python3 -c '
import json, sys
(deployment,) = json.load(sys.stdin)["items"]
(container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
for arg in container["args"]:
    print(arg)
' || fail "no operator container args in operator.yaml"
}

start_operator() {
  step "6/8 the zero-code operator (deploy/operator.yaml's args) as plugins/$OPERATOR_SA"
  k apply -f "$EXAMPLE/deploy/operator-rbac.yaml" >/dev/null || fail "cannot apply operator-rbac.yaml"
  token plugins "$OPERATOR_SA" "$DIR/operator.token"
  token_kubeconfig "$DIR/operator.token" "$DIR/operator.kubeconfig"
  local args
  args="$(operator_args)"
  local -a manifest_args
  mapfile -t manifest_args <<<"$args"
  [ "${#manifest_args[@]}" -gt 0 ] && [ -n "${manifest_args[0]}" ] || fail "operator.yaml has no args"
  note "args from operator.yaml: ${manifest_args[*]}"
  # /metrics on a loopback port of its own (the log says which), not :8443.
  KPLUG_LOG=info NO_COLOR=1 start_bg operator "$DIR/operator.log" "$BIN/kplug-operator" "${manifest_args[@]}" \
    --kubeconfig "$DIR/operator.kubeconfig" \
    --leader-election-namespace plugins --leader-election-identity walkthrough \
    --metrics-bind-address 127.0.0.1:0
  WATCH=(kplug mariadbd postgresql-plugin mariadb-plugin operator)
  wait_for 90 "the operator's controller started" grep -q "controller started" "$DIR/operator.log"
}

# table_ready: the DatabaseTable users has the condition Ready=True.
table_ready() {
  k get databasetable users -o json | python3 -c '
import json, sys
conditions = json.load(sys.stdin).get("status", {}).get("conditions", [])
sys.exit(0 if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else 1)'
}

reconcile_users() {
  step "7/8 kubectl apply -f examples/database-table/users.yaml, until the DatabaseTable users is Ready"
  echo "\$ kubectl apply -f examples/database-table/users.yaml"
  k apply -f "$EXAMPLE/users.yaml" || fail "cannot apply users.yaml"
  wait_for 120 "DatabaseTable users Ready=True" table_ready
  echo
  echo "\$ kubectl get databasetables,plugins"
  k get databasetables,plugins
  echo
  echo "\$ kubectl describe databasetable users"
  k describe databasetable users
  echo
  echo "\$ mariadb $MARIADB_DATABASE -e 'show create table users'   # the preferred implementation"
  mariadb_root "$MARIADB_DATABASE" -e 'show create table users\G'
}

verify() {
  step "7/8 verifying: served by MariaDB, the table users has the columns id, name"
  local implementation columns
  implementation="$(k get databasetable users -o jsonpath='{.status.implementation}')"
  columns="$(mariadb_root --skip-column-names -e "$WALKTHROUGH_COLUMNS_SQL")"
  check_result "$implementation" "$columns"
}

print_hints() {
  local mariadb_pid pg_pid
  mariadb_pid="$(pid_of mariadb-plugin)"
  pg_pid="$(pid_of postgresql-plugin)"
  cat <<EOF

== 8/8 the walkthrough is running. Keep exploring, in another terminal:

  export KUBECONFIG=$DIR/admin.kubeconfig
  kubectl get plugins -w                  # ADDED / MODIFIED / DELETED as plugins come and go
  kubectl get dbtable users -o yaml       # status: implementation, plugin, selection, conditions
  kubectl describe databasetable users    # conditions and Events
  kubectl api-resources --api-group plugins.kplug.io

  # Change the table: the operator delegates again and the plugin alters it.
  kubectl patch dbtable users --type merge -p '$WALKTHROUGH_ADD_EMAIL'
  $MARIADB_CLIENT --no-defaults --socket=$MARIADB_SOCKET --user=root $MARIADB_DATABASE -e 'show create table users\\G'

  # Freeze the MariaDB plugin: its heartbeats stop, kplug marks it Ready=False
  # after 2 missed intervals and drops it after 3. Change users meanwhile: it
  # waits for MariaDB (Sticky binding: its data never moves silently), with
  # Synced=False PluginUnavailable, and catches up when the plugin is back.
  kill -STOP $mariadb_pid; sleep 4; kubectl get plugins
  kubectl patch dbtable users --type merge -p '$WALKTHROUGH_EMAIL_TEXT'
  sleep 2; kubectl describe dbtable users | tail -n 8
  kill -CONT $mariadb_pid; sleep 4; kubectl describe dbtable users | tail -n 8
  # (kill $mariadb_pid stops it for good: it deregisters at once.)

  # A table that prefers PostgreSQL goes to the Python plugin (pid $pg_pid):
  echo '$WALKTHROUGH_ACCOUNTS' | kubectl apply -f -
  kubectl get dbtable; psql '$PG_DSN' -c '\\d accounts'

  kubectl delete dbtable users            # the finalizer lets the plugin drop the table first

Logs: $DIR/*.log (kplug.log, operator.log, postgresql-plugin.log,
mariadb-plugin.log, mariadb.log, postgres.log, kube-apiserver.log, etcd.log)
PIDs: $DIR/*.pid

Press Ctrl-C to stop everything.
EOF
}

wait_for_interrupt() {
  local warned="" name pid
  # Until Ctrl-C (the INT trap exits, the EXIT trap cleans up).
  while :; do
    sleep 2
    [ -z "$warned" ] || continue
    for name in kplug operator; do
      pid="$(pid_of "$name")"
      if ! ours "$pid"; then
        note "warning: $name (pid $pid) exited; see $DIR/$name.log"
        warned=1
      fi
    done
  done
}

main() {
  case "${1:-}" in
    "") ;;
    --check) CHECK=1 ;;
    -h | --help) usage 0 ;;
    *) usage ;;
  esac
  [ $# -le 1 ] || usage

  trap cleanup EXIT
  trap 'INTERRUPTED=1; exit 130' INT
  trap 'INTERRUPTED=1; exit 143' TERM

  local t0=$SECONDS
  setup_machine
  prepare_dir # before the build: a bad DIR fails at once
  build
  start_control_plane
  install_kplug
  start_databases
  start_plugins
  start_operator
  reconcile_users
  if [ -n "$CHECK" ]; then
    verify
    step "walkthrough verified in $((SECONDS - t0))s"
    return 0
  fi
  print_hints
  WAITING=1
  wait_for_interrupt
}

main "$@"; exit  # one line: bash has read it all, edits to this file cannot affect a run
