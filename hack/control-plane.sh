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
# KPLUG_CP_APISERVER_EXTRA_ARGS adds (word-split) kube-apiserver flags.
# The kube-apiserver binary comes from $KUBE_APISERVER if set, else from
# hack/kube-apiserver-build.sh (cached build; builds it if missing).
# No controller-manager or scheduler runs: create ServiceAccounts yourself.
# stop: kills the two recorded PIDs (SIGTERM, then SIGKILL after 10 s), after
# checking that each PID still runs the expected binary.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICE_CIDR=10.0.0.0/24
SERVICE_IP=10.0.0.1 # first IP of SERVICE_CIDR: the `kubernetes` Service
SA_ISSUER=https://kubernetes.default.svc
API_AUDIENCES=https://kubernetes.default.svc

log() { echo "[control-plane] $*" >&2; }
die() { log "$*"; exit 1; }

usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

# pid_is PID NAME: PID is alive and its executable is named NAME.
pid_is() {
  local pid="$1" name="$2" exe
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  exe="${exe% (deleted)}"
  [ "$(basename "$exe")" = "$name" ]
}

# wait_exec PID NAME: right after `cmd &`, PID is still the forked shell (or
# setsid) for a moment; wait until it has exec'd NAME.
wait_exec() {
  local i
  for i in $(seq 1 100); do
    pid_is "$1" "$2" && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# free_port EXCLUDED...: a TCP port nobody listens on 127.0.0.1.
free_port() {
  local p i
  for i in $(seq 1 200); do
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

# --- certificates -------------------------------------------------------------
# make_ca NAME CN
make_ca() {
  local name="$1" cn="$2"
  [ -f "$PKI/$name.crt" ] && return 0
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/$name.key" -sha256 -days 3650 -subj "/CN=$cn" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/$name.crt" 2>/dev/null
}

# make_cert NAME CA SUBJECT EXT_LINES...
make_cert() {
  local name="$1" ca="$2" subj="$3"; shift 3
  [ -f "$PKI/$name.crt" ] && return 0
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "$@" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -sha256 -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  make_ca ca kplug-e2e-cluster-ca
  make_ca front-proxy-ca kplug-e2e-front-proxy-ca
  make_cert apiserver ca "/CN=kube-apiserver" \
    "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  make_cert admin ca "/O=system:masters/CN=kubernetes-admin" \
    "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth"
  make_cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" \
    "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth"
  if [ ! -f "$PKI/sa.key" ]; then
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  chmod 600 "$PKI"/*.key
}

write_kubeconfig() {
  local url="$1" out="$2"
  b64() { base64 -w0 <"$1"; }
  cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kplug-e2e
  cluster:
    server: $url
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: kubernetes-admin
  user:
    client-certificate-data: $(b64 "$PKI/admin.crt")
    client-key-data: $(b64 "$PKI/admin.key")
contexts:
- name: kplug-e2e
  context:
    cluster: kplug-e2e
    user: kubernetes-admin
current-context: kplug-e2e
EOF
  chmod 600 "$out.tmp"
  mv -f "$out.tmp" "$out"
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
  local pid name waited
  for entry in "${APISERVER_PID:-}:kube-apiserver" "${ETCD_PID:-}:etcd"; do
    pid="${entry%%:*}"; name="${entry#*:}"
    [ -n "$pid" ] || continue
    if pid_is "$pid" "$name"; then
      kill -TERM "$pid" 2>/dev/null || true
      waited=0
      while pid_is "$pid" "$name" && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
      if pid_is "$pid" "$name"; then
        log "$name ($pid) ignored SIGTERM; SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      log "stopped $name ($pid)"
    fi
  done
}

cmd_start() {
  command -v etcd >/dev/null || die "etcd not found: run hack/kube-apiserver-build.sh (installs etcd-server)"
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
    bin="$("$HACK_DIR/kube-apiserver-build.sh")"
  fi
  [ -x "$bin" ] || die "kube-apiserver binary not executable: $bin"

  mkdir -p "$DIR"
  make_pki

  local etcd_port etcd_peer_port api_port
  etcd_port="$(free_port)"
  etcd_peer_port="$(free_port "$etcd_port")"
  api_port="$(free_port "$etcd_port" "$etcd_peer_port")"
  local etcd_url="http://127.0.0.1:$etcd_port"
  local api_url="https://127.0.0.1:$api_port"
  local t0; t0=$(date +%s%N)

  APISERVER_PID=""; ETCD_PID=""
  mkdir -p "$DIR/etcd-data"
  chmod 700 "$DIR/etcd-data"
  log "starting etcd on $etcd_url"
  # setsid: own session, so the caller's Ctrl-C / process-group signals do not
  # reach it; all stdio redirected so callers reading our stdout see EOF.
  setsid etcd \
    --name kplug-e2e \
    --data-dir "$DIR/etcd-data" \
    --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "kplug-e2e=http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster-state new \
    --logger zap --log-level warn \
    </dev/null >"$DIR/etcd.log" 2>&1 &
  ETCD_PID=$!
  wait_exec "$ETCD_PID" etcd || fail_start "etcd did not start"
  local i
  for i in $(seq 1 300); do
    pid_is "$ETCD_PID" etcd || fail_start "etcd exited"
    curl -fsS -m 2 "$etcd_url/health" 2>/dev/null | grep -q '"health":"true"' && break
    [ "$i" = 300 ] && fail_start "etcd not healthy after 30 s"
    sleep 0.1
  done

  local args=(
    --bind-address=127.0.0.1
    --secure-port="$api_port"
    --insecure-port=0
    --cert-dir="$DIR/pki"
    --etcd-servers="$etcd_url"
    --tls-cert-file="$PKI/apiserver.crt"
    --tls-private-key-file="$PKI/apiserver.key"
    --client-ca-file="$PKI/ca.crt"
    --authorization-mode=RBAC
    --service-cluster-ip-range="$SERVICE_CIDR"
    --endpoint-reconciler-type=none
    --service-account-key-file="$PKI/sa.pub"
    --service-account-signing-key-file="$PKI/sa.key"
    --service-account-issuer="$SA_ISSUER"
    --api-audiences="$API_AUDIENCES"
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt"
    --requestheader-allowed-names=front-proxy-client
    --requestheader-username-headers=X-Remote-User
    --requestheader-group-headers=X-Remote-Group
    --requestheader-extra-headers-prefix=X-Remote-Extra-
    --proxy-client-cert-file="$PKI/front-proxy-client.crt"
    --proxy-client-key-file="$PKI/front-proxy-client.key"
    --enable-aggregator-routing=false
    --profiling=false
    ${KPLUG_CP_APISERVER_EXTRA_ARGS:-}
  )
  printf '%s\n' "$bin" "${args[@]}" >"$DIR/kube-apiserver.args"
  log "starting kube-apiserver on $api_url"
  setsid "$bin" "${args[@]}" </dev/null >"$DIR/kube-apiserver.log" 2>&1 &
  APISERVER_PID=$!
  wait_exec "$APISERVER_PID" kube-apiserver || fail_start "kube-apiserver did not start"

  write_kubeconfig "$api_url" "$DIR/admin.kubeconfig"
  local timeout="${KPLUG_CP_TIMEOUT:-90}" deadline ready=""
  deadline=$(( $(date +%s) + timeout ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    pid_is "$APISERVER_PID" kube-apiserver || fail_start "kube-apiserver exited"
    pid_is "$ETCD_PID" etcd || fail_start "etcd exited"
    if [ "$(curl -sS -m 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
          "$api_url/readyz" 2>/dev/null || true)" = ok ]; then
      ready=1; break
    fi
    sleep 0.25
  done
  [ -n "$ready" ] || fail_start "kube-apiserver not ready after ${timeout}s ($(curl -sS -m 5 --cacert "$PKI/ca.crt" \
    --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$api_url/readyz?verbose" 2>&1 | grep -v ' ok$' | tr '\n' ' '))"
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
