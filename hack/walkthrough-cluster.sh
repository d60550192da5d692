#!/usr/bin/env bash
# The DatabaseTable walkthrough (examples/database-table) with pods, on a
# real single-node Kubernetes v1.20 on this machine (hack/cluster.sh):
# kplug, both plugins and the zero-code operator (2 replicas, leader
# election) from their images, installed by the READMEs' own steps (run by
# hack/tests/install.py, as the tests run them), the throwaway PostgreSQL
# and MariaDB of examples/database-table/deploy/databases/ as pods, then
# examples/database-table/users.yaml until the table `users` is in MariaDB.
#
#   hack/walkthrough.sh --cluster           # bring it all up, show the table and what to
#                                           # try next, wait for Ctrl-C (or SIGTERM), then
#                                           # take it all down and exit 0
#   hack/walkthrough.sh --cluster --check   # bring it up, verify, take it down; exit 0 on
#                                           # success (for tests)
#
# (hack/walkthrough-cluster.sh [--check] is the same.) One cluster per
# machine: it refuses to start while one is up (see hack/cluster.sh status),
# because it brings up its own and takes it down at the end, also after a
# failure (first showing the pods' and the daemons' logs). Needs root.
#
# It runs hack/setup.sh (slow only the first time), builds kplug-apiserver
# (debug; certs/ runs it) with cargo and the six images with hack/images.sh
# (buildah; minutes the first time, then only what changed), brings the
# cluster up and loads the images into its containerd. The databases'
# passwords are random: the walkthrough creates their Secrets (db/postgres,
# db/mariadb) and fills them into the plugins' Secrets in place of the
# README's PASSWORD. Progress goes to stderr ("== step"), what it shows to
# stdout. Nothing listens on the host beyond the cluster's own daemons, and
# no pod reaches beyond the machine (hack/cluster.sh).
#
# Environment:
#   KPLUG_WALKTHROUGH_DIR      where the READMEs' commands run (a copy of the
#       repository's files; certs/ made there), their output
#       (DIR/.install-logs/) and, after a failure, the pods' logs, objects,
#       events and the cluster daemons' logs (DIR/diagnostics/). Must be
#       absent or empty. Default: a new /tmp/kplug-walkthrough-cluster.XXXXXX,
#       removed on exit except after a failure. A DIR given here is never removed.
#   KPLUG_WALKTHROUGH_KEEP=1   keep the default DIR on exit.
#   KPLUG_CLUSTER_DIR          hack/cluster.sh's state (default /var/lib/kplug-cluster).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/lib/walkthrough.sh
. "$ROOT/hack/lib/walkthrough.sh"
EXAMPLE="$ROOT/examples/database-table"
CLUSTER_DIR="${KPLUG_CLUSTER_DIR:-/var/lib/kplug-cluster}"
IMAGES=(kplug-apiserver kplug-operator database-table-postgresql-plugin database-table-mariadb-plugin
  walkthrough-postgres walkthrough-mariadb)
DB_IMAGES=(walkthrough-postgres walkthrough-mariadb)
PLUGINS=(database-table-postgresql-plugin database-table-mariadb-plugin)
OPERATOR=database-table-operator
LEASE=kplug-operator-databasetables.myorg.org

CHECK=""
DIR=""
MADE_DIR=""         # DIR is ours to delete
CLUSTER_STARTED=""  # ours to take down
CLEANED=""
INTERRUPTED=""      # Ctrl-C or SIGTERM
WAITING=""          # set up and waiting for Ctrl-C: an interrupt is the normal end
SLEEPER=""
TIMES=()            # "WHAT SECONDS", for the summary

fail() {
  echo "walkthrough: FAILED: $*" >&2
  exit 1
}

k() { kubectl --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" "$@"; }

# timed WHAT COMMAND...: runs COMMAND and records how long it took.
timed() {
  local what="$1" start=$SECONDS
  shift
  "$@"
  TIMES+=("$what $((SECONDS - start))")
}

summary() {
  local entry out=""
  for entry in "${TIMES[@]}"; do out+="${out:+, }${entry% *} ${entry##* }s"; done
  echo "$out"
}

cluster_on_machine() {
  [ -e "$CLUSTER_DIR" ] || ip link show kplug0 >/dev/null 2>&1
}

# --- after a failure: what went wrong, kept in DIR/diagnostics --------------

diagnose() {
  local out="$DIR/diagnostics" ns pod name f
  [ -f "$CLUSTER_DIR/admin.kubeconfig" ] || return 0
  mkdir -p "$out/pods"
  k get nodes,pods,deployments,services,endpoints -A -o wide >"$out/objects.txt" 2>&1
  k get events -A --sort-by=.lastTimestamp >"$out/events.txt" 2>&1
  for f in apiservice/v1alpha1.plugins.kplug.io plugins databasetables "leases -n plugins"; do
    echo "--- kubectl get $f -o yaml ---"
    # shellcheck disable=SC2086 # the namespace flag
    k get $f -o yaml 2>&1
  done >"$out/kplug-objects.yaml"
  for ns in kplug-system plugins db; do
    for pod in $(k -n "$ns" get pods -o name 2>/dev/null); do
      name="$ns.${pod#pod/}"
      k -n "$ns" describe "$pod" >"$out/pods/$name.describe.txt" 2>&1
      k -n "$ns" logs "$pod" --all-containers >"$out/pods/$name.log" 2>&1
      k -n "$ns" logs "$pod" --all-containers --previous >"$out/pods/$name.previous.log" 2>/dev/null ||
        rm -f "$out/pods/$name.previous.log"
    done
  done
  cp -r "$CLUSTER_DIR/logs" "$out/cluster-logs" 2>/dev/null
  {
    echo "--- kubectl get pods -A -o wide ---"
    k get pods -A -o wide
    echo "--- the last events ---"
    tail -n 15 "$out/events.txt"
    for f in "$DIR"/.install-logs/*.log "$out"/pods/*.log; do
      [ -s "$f" ] || continue
      echo "--- last 15 lines of $f ---"
      tail -n 15 "$f"
    done
  } >&2 2>&1
  note "diagnostics (objects, events, every pod's log, the cluster daemons' logs): $out"
}

cleanup() {
  local rc=$?
  [ -z "$CLEANED" ] || return 0
  CLEANED=1
  trap '' INT TERM
  set +e
  [ -z "$SLEEPER" ] || kill "$SLEEPER" 2>/dev/null
  if [ -n "$INTERRUPTED" ]; then
    if [ -n "$WAITING" ]; then rc=0; else echo "walkthrough: interrupted" >&2; fi
  elif [ "$rc" -ne 0 ]; then
    echo "walkthrough: FAILED (exit $rc)" >&2
    [ -z "$CLUSTER_STARTED" ] || diagnose
  fi
  if [ -n "$CLUSTER_STARTED" ]; then
    step "taking the cluster down: hack/cluster.sh down"
    local start=$SECONDS line down=0
    # Its progress, each line with the seconds since the start; its failure
    # (pipefail) reported below, not an exit under set -e.
    "$ROOT/hack/cluster.sh" down 2>&1 | while IFS= read -r line; do echo "   +$((SECONDS - start))s $line"; done >&2 ||
      down=$?
    if [ "$down" = 0 ]; then
      note "down in $((SECONDS - start))s"
    else
      echo "walkthrough: hack/cluster.sh down failed" >&2
      rc=1
    fi
  fi
  if [ -n "$MADE_DIR" ]; then
    if { [ "$rc" -eq 0 ] || [ -n "$INTERRUPTED" ]; } && [ -z "${KPLUG_WALKTHROUGH_KEEP:-}" ]; then
      rm -rf "$DIR"
    else
      note "kept $DIR"
    fi
  fi
  exit "$rc"
}

# --- steps --------------------------------------------------------------------

preflight() {
  [ "$(id -u)" = 0 ] || fail "must run as root (hack/cluster.sh makes a bridge, iptables rules and mounts)"
  if cluster_on_machine; then
    "$ROOT/hack/cluster.sh" status 2>&1 | sed 's/^/   /' >&2 || true
    fail "a cluster is already up on this machine ($CLUSTER_DIR). The walkthrough brings up its own
and takes it down at the end, so it leaves that one alone: if it is yours
and nothing uses it, take it down (hack/cluster.sh down) and run this again."
  fi
  if [ -n "${KPLUG_WALKTHROUGH_DIR:-}" ]; then
    DIR="$(realpath -m "$KPLUG_WALKTHROUGH_DIR")"
    mkdir -p "$DIR"
    [ -z "$(ls -A "$DIR")" ] || fail "KPLUG_WALKTHROUGH_DIR=$DIR is not empty"
  else
    DIR="$(mktemp -d /tmp/kplug-walkthrough-cluster.XXXXXX)"
    MADE_DIR=1
  fi
  note "working directory: $DIR"
}

build() {
  step "1/7 hack/setup.sh, cargo build -p kplug-apiserver (certs/ runs it), hack/images.sh build"
  "$ROOT/hack/setup.sh"
  (cd "$ROOT" && cargo build --locked -p kplug-apiserver) || fail "cargo build -p kplug-apiserver failed"
  "$ROOT/hack/images.sh" build "${IMAGES[@]}" || fail "hack/images.sh build failed"
}

cluster_up() {
  step "2/7 a real single-node Kubernetes: hack/cluster.sh up"
  # Nobody else's: checked by preflight, and hack/cluster.sh up refuses too.
  CLUSTER_STARTED=1
  "$ROOT/hack/cluster.sh" up >/dev/null || fail "hack/cluster.sh up failed"
  # KUBECONFIG, CONTAINERD_ADDRESS (for hack/images.sh load), KPLUG_CLUSTER_*.
  eval "$("$ROOT/hack/cluster.sh" env)"
  "$ROOT/hack/images.sh" load "${DB_IMAGES[@]}" || fail "hack/images.sh load ${DB_IMAGES[*]} failed"
}

install_all() {
  step "3/7 the databases, kplug, the plugins and the operator, by the READMEs' steps (hack/tests/install.py)"
  note "examples/database-table/deploy/databases/README.md, Install (random passwords)"
  note "README.md, Install (images from hack/images.sh, the Kubernetes 1.20 overlay)"
  note "examples/database-table/deploy/README.md, Install (the passwords in the plugins' Secrets)"
  PG_PASSWORD="$(openssl rand -hex 16)" MARIADB_PASSWORD="$(openssl rand -hex 16)" \
    python3 "$ROOT/hack/tests/install.py" --databases "$DIR" || fail "installing by the READMEs failed"
  note "the commands and their output: $DIR/.install-logs/"
}

# plugin_ready NAME: kplug lists the Plugin NAME with Ready=True.
plugin_ready() {
  [ "$(k get plugin "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

wait_ready() {
  step "4/7 waiting for both plugins to heartbeat to kplug and the operator's 2 replicas"
  local name deadline=$((SECONDS + 180))
  for name in "${PLUGINS[@]}" "$OPERATOR"; do
    k -n plugins rollout status "deploy/$name" --timeout=3m >/dev/null ||
      fail "deploy/$name in plugins did not roll out"
  done
  # A plugin is listed once its first heartbeat arrives: wait for it to
  # appear, then for its Ready condition (both are watches).
  for name in "${PLUGINS[@]}"; do
    until plugin_ready "$name"; do
      [ "$SECONDS" -lt "$deadline" ] || fail "plugin $name not Ready: $(k get plugin "$name" -o yaml 2>&1)"
      k wait --for=create "plugin/$name" --timeout=$((deadline - SECONDS))s >/dev/null 2>&1 || true
      k wait --for=condition=Ready "plugin/$name" --timeout=$((deadline - SECONDS))s >/dev/null 2>&1 || true
    done
  done
  note "plugins Ready: ${PLUGINS[*]}"
}

reconcile_users() {
  step "5/7 kubectl apply -f examples/database-table/users.yaml, until the DatabaseTable users is Ready"
  echo "\$ kubectl apply -f examples/database-table/users.yaml"
  k apply -f "$EXAMPLE/users.yaml" || fail "cannot apply users.yaml"
  k wait --for=condition=Ready databasetable/users --timeout=120s >/dev/null ||
    fail "DatabaseTable users not Ready within 120s: $(k describe databasetable users 2>&1)"
  echo
  echo "\$ kubectl get pods -n kplug-system; kubectl get pods -n plugins; kubectl get pods -n db"
  k get pods -n kplug-system
  k get pods -n plugins
  k get pods -n db
  echo
  echo "\$ kubectl get databasetables,plugins"
  k get databasetables,plugins
  echo
  echo "\$ kubectl describe databasetable users"
  k describe databasetable users
  echo
  echo "\$ kubectl -n db exec deploy/mariadb -- mariadb $WALKTHROUGH_DATABASE -e 'SHOW CREATE TABLE users\\G'   # the preferred implementation"
  k -n db exec deploy/mariadb -- mariadb "$WALKTHROUGH_DATABASE" -e 'SHOW CREATE TABLE users\G' ||
    fail "cannot show the table in MariaDB"
}

verify() {
  step "6/7 verifying: served by MariaDB, the table has the columns id, name; one operator replica leads"
  local implementation columns holder pods
  implementation="$(k get databasetable users -o jsonpath='{.status.implementation}')"
  columns="$(k -n db exec deploy/mariadb -- mariadb --batch --skip-column-names -e "$WALKTHROUGH_COLUMNS_SQL")" ||
    fail "cannot query MariaDB"
  check_result "$implementation" "$columns"
  holder="$(k -n plugins get lease "$LEASE" -o jsonpath='{.spec.holderIdentity}')" || fail "no Lease $LEASE"
  pods="$(k -n plugins get pods -l app.kubernetes.io/name="$OPERATOR" --field-selector=status.phase=Running -o name)"
  [ "$(wc -l <<<"$pods")" = 2 ] || fail "expected 2 running operator pods, not: $pods"
  # The identity is the pod's name (POD_NAME in operator.yaml).
  grep -qx "pod/$holder" <<<"$pods" || fail "the Lease's holder '$holder' is not an operator pod ($pods)"
  note "ok: the Lease $LEASE is held by $holder, one of 2 operator replicas"
}

# rss_kib PID...: the sum of their resident set sizes.
rss_kib() {
  [ $# -gt 0 ] || { echo 0; return; }
  ps -o rss= -p "$(IFS=,; echo "$*")" | awk '{s += $1} END {print s + 0}'
}

# memory: the resident memory of the cluster's daemons, the containerd
# shims and every process in a pod (the sum of RSS, as ps shows it).
memory() {
  local daemons=() shims=() pods=() f by_name
  for f in "$CLUSTER_DIR"/pids/*; do daemons+=("$(cat "$f")"); done
  mapfile -t shims < <(pgrep -f "containerd-shim-runc-v2 .*-address $CLUSTER_DIR/containerd/containerd.sock" || true)
  mapfile -t pods < <(find /sys/fs/cgroup/memory/kubepods /sys/fs/cgroup/kubepods -name cgroup.procs \
    -exec cat {} + 2>/dev/null | sort -un)
  # By program: the executable's name, or a Python program's script.
  by_name="$(ps -o rss=,args= -p "$(IFS=,; echo "${daemons[*]},${pods[*]}")" |
    awk '{n = $2; if (n ~ /python/ && $3 != "") n = $3; sub(/.*\//, "", n); sub(/:$/, "", n); kib[n] += $1}
      END {for (n in kib) printf "%s %d\n", n, kib[n] / 1024}' | sort -k2,2nr |
    awk '{printf "%s%s %d", (NR > 1 ? ", " : ""), $1, $2} END {print ""}')"
  local d s p
  d="$(rss_kib "${daemons[@]}")"
  s="$(rss_kib "${shims[@]}")"
  p="$(rss_kib "${pods[@]}")"
  note "memory (RSS, MiB): $(((d + s + p) / 1024)) in all: the cluster's daemons $((d / 1024)),"
  note "  ${#shims[@]} containerd shims $((s / 1024)), ${#pods[@]} processes in pods $((p / 1024));"
  note "  by program: $by_name"
  # The pods' cgroup counts page cache too (cgroup v1; v2 has memory.current).
  local cg=/sys/fs/cgroup/memory/kubepods
  if [ -f "$cg/memory.usage_in_bytes" ]; then
    note "  the cgroup kubepods: memory.usage_in_bytes $(($(cat "$cg/memory.usage_in_bytes") / 1048576)) MiB," \
      "of which rss $(($(awk '$1 == "total_rss" {print $2}' "$cg/memory.stat") / 1048576))"
  elif [ -f /sys/fs/cgroup/kubepods/memory.current ]; then
    note "  the cgroup kubepods: memory.current $(($(cat /sys/fs/cgroup/kubepods/memory.current) / 1048576)) MiB"
  fi
}

print_hints() {
  cat <<EOF

== 7/7 the walkthrough runs on the cluster. Keep exploring, in another terminal:

  export KUBECONFIG=$CLUSTER_DIR/admin.kubeconfig
  kubectl get pods -A -o wide
  kubectl get plugins -w                  # ADDED / MODIFIED / DELETED as plugins come and go
  kubectl get dbtable users -o yaml       # status: implementation, plugin, selection, conditions
  kubectl describe databasetable users    # conditions and Events
  kubectl -n plugins get lease $LEASE   # the operator replica that leads

  # Change the table: the operator delegates again and the plugin alters it.
  kubectl patch dbtable users --type merge -p '$WALKTHROUGH_ADD_EMAIL'
  kubectl -n db exec deploy/mariadb -- mariadb $WALKTHROUGH_DATABASE -e 'SHOW CREATE TABLE users\\G'

  # Stop the MariaDB plugin: its pods drain and deregister, and kplug lists it
  # no more. Change users meanwhile: it waits for MariaDB (Sticky binding: its
  # data never moves silently), with Synced=False PluginUnavailable, and
  # catches up when the plugin is back.
  kubectl -n plugins scale deploy/database-table-mariadb-plugin --replicas=0
  kubectl patch dbtable users --type merge -p '$WALKTHROUGH_EMAIL_TEXT'
  kubectl describe dbtable users | tail -n 8
  kubectl -n plugins scale deploy/database-table-mariadb-plugin --replicas=2
  kubectl -n plugins rollout status deploy/database-table-mariadb-plugin; kubectl describe dbtable users | tail -n 8

  # Delete the leading operator pod: another replica takes the Lease over.
  kubectl -n plugins delete pod "\$(kubectl -n plugins get lease $LEASE -o jsonpath='{.spec.holderIdentity}')"
  kubectl -n plugins get lease $LEASE -w

  # A table that prefers PostgreSQL goes to the Python plugin:
  echo '$WALKTHROUGH_ACCOUNTS' | kubectl apply -f -
  kubectl get dbtable; kubectl -n db exec deploy/postgres -- psql -U tables $WALKTHROUGH_DATABASE -c '\\d accounts'

  kubectl delete dbtable users            # the finalizer lets the plugin drop the table first

Logs: kubectl -n kplug-system logs deploy/kplug; kubectl -n plugins logs deploy/$OPERATOR
(and deploy/database-table-mariadb-plugin, ...); the cluster's daemons: $CLUSTER_DIR/logs/
The READMEs' commands as they ran: $DIR/.install-logs/

Press Ctrl-C to take the cluster down.
EOF
}

main() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --check) CHECK=1 ;;
      -h | --help) usage 0 ;;
      *) usage ;;
    esac
    shift
  done

  trap cleanup EXIT
  trap 'INTERRUPTED=1; exit 130' INT
  trap 'INTERRUPTED=1; exit 143' TERM

  local t0=$SECONDS
  preflight
  timed build build
  timed "cluster up" cluster_up
  timed install install_all
  timed "plugins Ready" wait_ready
  timed "users Ready" reconcile_users
  step "ready in $((SECONDS - t0))s ($(summary))"
  memory
  if [ -n "$CHECK" ]; then
    verify
    step "the walkthrough on the cluster verified in $((SECONDS - t0))s"
    return 0
  fi
  print_hints
  WAITING=1
  sleep infinity &
  SLEEPER=$!
  wait "$SLEEPER"
}

main "$@"; exit  # one line: bash has read it all, edits to this file cannot affect a run
