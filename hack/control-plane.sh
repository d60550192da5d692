#!/usr/bin/env bash
# A private, real Kubernetes control plane (etcd + kube-apiserver v1.20.2) on
# loopback, for end-to-end tests of kplug as an aggregated API server.
#
#   hack/control-plane.sh start DIR   # prints DIR/admin.kubeconfig on stdout
#   hack/control-plane.sh stop DIR    # stops what `start DIR` started
#   hack/control-plane.sh status DIR  # exit 0 if both processes are running
#
# start: makes certificates with openssl under DIR/pki (kept across restarts),
# starts etcd and kube-apiserver on free 127.0.0.1 ports, waits for /readyz
# (KPLUG_CP_TIMEOUT seconds, default 90), writes DIR/env and prints the admin
# kubeconfig path. DIR/env is shell-sourceable: KUBECONFIG (exported),
# KPLUG_APISERVER_{URL,HOST,PORT,PID,BIN,VERSION,LOG}, KPLUG_ETCD_{URL,PORT,
# PEER_PORT,PID,LOG}, KPLUG_PKI_DIR, KPLUG_CA_{CERT,KEY} (cluster CA, also the
# client CA), KPLUG_ADMIN_{CERT,KEY} (O=system:masters),
# KPLUG_FRONT_PROXY_{CA_CERT,CA_KEY,CLIENT_CERT,CLIENT_KEY,ALLOWED_NAMES},
# KPLUG_SA_{SIGNING_KEY,PUBLIC_KEY,ISSUER}, KPLUG_API_AUDIENCES,
# KPLUG_SERVICE_CIDR, KPLUG_START_MS. Logs: DIR/etcd.log, DIR/kube-apiserver.log;
# the exact kube-apiserver command line: DIR/kube-apiserver.args.
# KPLUG_CP_APISERVER_EXTRA_ARGS adds (word-split) kube-apiserver flags, after
# the script's own, so that they win (e.g. --profiling=true).
# The kube-apiserver binary comes from $KUBE_APISERVER if set, else from
# hack/kube-build.sh (cached build; builds it if missing).
# No controller-manager or scheduler runs: create ServiceAccounts yourself.
# stop: kills the two recorded PIDs (SIGTERM, then SIGKILL after 10 s), after
# checking that each PID still runs the expected binary.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICE_CIDR=10.0.0.0/24
SERVICE_IP=10.0.0.1 # first IP of SERVICE_CIDR: the `kubernetes` Service

LOG_PREFIX=control-plane
# shellcheck source=hack/lib/common.sh
. "$HACK_DIR/lib/common.sh"

usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

# free_port EXCLUDED...: a TCP port nobody listens on 127.0.0.1.
free_port() {
  local p
  for _ in $(seq 1 200); do
    # 20000-32767: below Linux's default ephemeral range (32768-60999).
    p=$(( 20000 + RANDOM % 12768 ))
    case " $* " in *" $p "*) continue ;; esac
    if command -v ss >/dev/null; then
      [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] || continue
    else
      (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    fi
    echo "$p"; return 0
  done
  die "no free port found"
}

# --- start / stop -------------------------------------------------------------
fail_start() {
  log "$1"
  local f
  for f in "$DIR/etcd.log" "$DIR/kube-apiserver.log"; do
    [ -f "$f" ] || continue
    log "--- last 30 lines of $f ---"
    tail -n 30 "$f" >&2
  done
  stop_pids || true
  exit 1
}

stop_pids() {
  stop_pid "${APISERVER_PID:-}" kube-apiserver
  stop_pid "${ETCD_PID:-}" etcd
}

cmd_start() {
  command -v etcd >/dev/null || die "etcd not found: run hack/kube-build.sh (installs etcd-server)"
  command -v openssl >/dev/null || die "openssl not found"
  command -v curl >/dev/null || die "curl not found"
  if [ -f "$DIR/env" ]; then
    # shellcheck disable=SC1091
    local APISERVER_PID ETCD_PID
    APISERVER_PID="$(. "$DIR/env"; echo "${KPLUG_APISERVER_PID:-}")"
    ETCD_PID="$(. "$DIR/env"; echo "${KPLUG_ETCD_PID:-}")"
    if pid_is "$APISERVER_PID" kube-apiserver || pid_is "$ETCD_PID" etcd; then
      die "a control plane is already running from $DIR (run: $0 stop $DIR)"
    fi
  fi

  local bin="${KUBE_APISERVER:-}"
  if [ -z "$bin" ]; then
    bin="$("$HACK_DIR/kube-build.sh" kube-apiserver)"
  fi
  [ -x "$bin" ] || die "kube-apiserver binary not executable: $bin"

  mkdir -p "$DIR"
  make_control_plane_pki "IP:127.0.0.1,IP:$SERVICE_IP"

  local etcd_port etcd_peer_port api_port
  etcd_port="$(free_port)"
  etcd_peer_port="$(free_port "$etcd_port")"
  api_port="$(free_port "$etcd_port" "$etcd_peer_port")"
  local etcd_url="http://127.0.0.1:$etcd_port"
  local api_url="https://127.0.0.1:$api_port"
  local t0; t0=$(date +%s%N)

  APISERVER_PID=""; ETCD_PID=""
  start_etcd "$DIR/etcd-data" "$DIR/etcd.log" "$etcd_port" "$etcd_peer_port"

  local args=(
    --bind-address=127.0.0.1
    --secure-port="$api_port"
    --insecure-port=0
    --cert-dir="$DIR/pki"
    --etcd-servers="$etcd_url"
    --authorization-mode=RBAC
    --service-cluster-ip-range="$SERVICE_CIDR"
    --endpoint-reconciler-type=none
  )
  mapfile -t -O "${#args[@]}" args < <(kube_apiserver_pki_args)
  local extra=()
  read -ra extra <<<"${KPLUG_CP_APISERVER_EXTRA_ARGS:-}"
  args+=("${extra[@]}")
  printf '%s\n' "$bin" "${args[@]}" >"$DIR/kube-apiserver.args"
  log "starting kube-apiserver on $api_url"
  (detach "$bin" "${args[@]}") </dev/null >"$DIR/kube-apiserver.log" 2>&1 &
  APISERVER_PID=$!
  wait_exec "$APISERVER_PID" kube-apiserver || fail_start "kube-apiserver did not start"

  write_kubeconfig "$api_url" admin "$DIR/admin.kubeconfig"
  wait_apiserver_ready "$api_url" "${KPLUG_CP_TIMEOUT:-90}" "$APISERVER_PID"
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))

  q() { printf '%q' "$1"; }
  cat >"$DIR/env.tmp" <<EOF
# Written by hack/control-plane.sh start; source it.
KPLUG_CP_DIR=$(q "$DIR")
KUBECONFIG=$(q "$DIR/admin.kubeconfig")
KPLUG_KUBECONFIG=$(q "$DIR/admin.kubeconfig")
KPLUG_APISERVER_URL=$(q "$api_url")
KPLUG_APISERVER_HOST=127.0.0.1
KPLUG_APISERVER_PORT=$api_port
KPLUG_APISERVER_PID=$APISERVER_PID
KPLUG_APISERVER_BIN=$(q "$bin")
KPLUG_APISERVER_VERSION=$(q "$("$bin" --version 2>/dev/null | awk '{print $2}')")
KPLUG_APISERVER_LOG=$(q "$DIR/kube-apiserver.log")
KPLUG_ETCD_URL=$(q "$etcd_url")
KPLUG_ETCD_PORT=$etcd_port
KPLUG_ETCD_PEER_PORT=$etcd_peer_port
KPLUG_ETCD_PID=$ETCD_PID
KPLUG_ETCD_LOG=$(q "$DIR/etcd.log")
KPLUG_PKI_DIR=$(q "$PKI")
KPLUG_CA_CERT=$(q "$PKI/ca.crt")
KPLUG_CA_KEY=$(q "$PKI/ca.key")
KPLUG_ADMIN_CERT=$(q "$PKI/admin.crt")
KPLUG_ADMIN_KEY=$(q "$PKI/admin.key")
KPLUG_FRONT_PROXY_CA_CERT=$(q "$PKI/front-proxy-ca.crt")
KPLUG_FRONT_PROXY_CA_KEY=$(q "$PKI/front-proxy-ca.key")
KPLUG_FRONT_PROXY_CLIENT_CERT=$(q "$PKI/front-proxy-client.crt")
KPLUG_FRONT_PROXY_CLIENT_KEY=$(q "$PKI/front-proxy-client.key")
KPLUG_FRONT_PROXY_ALLOWED_NAMES=front-proxy-client
KPLUG_SA_SIGNING_KEY=$(q "$PKI/sa.key")
KPLUG_SA_PUBLIC_KEY=$(q "$PKI/sa.pub")
KPLUG_SA_ISSUER=$(q "$SA_ISSUER")
KPLUG_API_AUDIENCES=$(q "$API_AUDIENCES")
KPLUG_SERVICE_CIDR=$SERVICE_CIDR
KPLUG_START_MS=$ms
export KUBECONFIG
EOF
  mv -f "$DIR/env.tmp" "$DIR/env"
  log "ready in ${ms} ms: kube-apiserver pid $APISERVER_PID, etcd pid $ETCD_PID; source $DIR/env"
  echo "$DIR/admin.kubeconfig"
}

cmd_stop() {
  [ -f "$DIR/env" ] || { log "no $DIR/env: nothing to stop"; return 0; }
  APISERVER_PID="$(. "$DIR/env"; echo "${KPLUG_APISERVER_PID:-}")"
  ETCD_PID="$(. "$DIR/env"; echo "${KPLUG_ETCD_PID:-}")"
  stop_pids
}

cmd_status() {
  [ -f "$DIR/env" ] || { log "no $DIR/env"; return 1; }
  APISERVER_PID="$(. "$DIR/env"; echo "${KPLUG_APISERVER_PID:-}")"
  ETCD_PID="$(. "$DIR/env"; echo "${KPLUG_ETCD_PID:-}")"
  local ok=0
  if pid_is "$APISERVER_PID" kube-apiserver; then log "kube-apiserver running ($APISERVER_PID)"; else log "kube-apiserver not running"; ok=1; fi
  if pid_is "$ETCD_PID" etcd; then log "etcd running ($ETCD_PID)"; else log "etcd not running"; ok=1; fi
  return $ok
}

[ $# -eq 2 ] || usage
[ "$1" != start ] || mkdir -p "$2"
[ -d "$2" ] || { log "no directory $2"; [ "$1" = stop ] && exit 0; exit 1; }
DIR="$(cd "$2" && pwd)"
PKI="$DIR/pki"
case "$1" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
