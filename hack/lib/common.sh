# shellcheck shell=bash
# Shell helpers shared by hack/control-plane.sh and hack/cluster.sh: logging,
# processes recorded by PID, certificates made with openssl, kubeconfigs.
# Source it; set LOG_PREFIX first, and PKI before the certificate helpers.

log() { echo "[${LOG_PREFIX:-hack}] $*" >&2; }
die() { log "$*"; exit 1; }

# pid_is PID NAME: PID is alive and its executable is named NAME.
pid_is() {
  local pid="$1" name="$2" exe
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  exe="${exe% (deleted)}"
  [ "$(basename "$exe")" = "$name" ]
}

# detach CMD ARGS...: execs CMD in a session of its own (setsid: the caller's
# Ctrl-C and process-group signals do not reach it) with no descriptor open
# but 0-2: a lock its caller holds (flock on a descriptor) must not stay
# held by a daemon that outlives the caller. Run it in the background,
# `( detach CMD ... ) <in >out 2>&1 &`, and `$!` is CMD's PID once it has
# exec'd (wait_exec).
detach() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd="${fd##*/}"
    if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
  done
  exec setsid "$@"
}

# wait_exec PID NAME: right after `cmd &`, PID is still the forked shell (or
# setsid) for a moment; wait until it has exec'd NAME.
wait_exec() {
  for _ in $(seq 1 100); do
    pid_is "$1" "$2" && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# stop_pid PID NAME: SIGTERM, then SIGKILL after 10 s; only while PID still
# runs NAME (a recycled PID is left alone).
stop_pid() {
  local pid="$1" name="$2" waited=0
  pid_is "$pid" "$name" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  while pid_is "$pid" "$name" && [ $waited -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
  if pid_is "$pid" "$name"; then
    log "$name ($pid) ignored SIGTERM; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  log "stopped $name ($pid)"
}

# --- certificates -------------------------------------------------------------
# Every leaf gets basicConstraints, keyUsage and extendedKeyUsage: rustls
# refuses X.509 v1 certificates, which is what `openssl x509 -req` makes
# without extensions.

# make_ca NAME CN: $PKI/NAME.{crt,key}, kept if present.
make_ca() {
  local name="$1" cn="$2"
  [ -f "$PKI/$name.crt" ] && return 0
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/$name.key" -sha256 -days 3650 -subj "/CN=$cn" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/$name.crt" 2>/dev/null
}

# make_cert NAME CA SUBJECT EXT_LINES...: $PKI/NAME.{crt,key} signed by CA.
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

# make_client_cert NAME CA SUBJECT: a clientAuth-only leaf.
make_client_cert() {
  make_cert "$1" "$2" "$3" \
    "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=clientAuth"
}

# make_service_account_key: $PKI/sa.{key,pub}, the ServiceAccount token key pair.
make_service_account_key() {
  [ -f "$PKI/sa.key" ] && return 0
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# write_kubeconfig URL CLIENT OUT: a kubeconfig for $PKI/CLIENT.{crt,key}
# trusting $PKI/ca.crt, written 0600 and atomically.
write_kubeconfig() {
  local url="$1" client="$2" out="$3"
  b64() { base64 -w0 <"$1"; }
  cat >"$out.tmp" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: kplug-e2e
  cluster:
    server: $url
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $client
  user:
    client-certificate-data: $(b64 "$PKI/$client.crt")
    client-key-data: $(b64 "$PKI/$client.key")
contexts:
- name: kplug-e2e
  context:
    cluster: kplug-e2e
    user: $client
current-context: kplug-e2e
KUBECONFIG
  chmod 600 "$out.tmp"
  mv -f "$out.tmp" "$out"
}

# --- a control plane: the parts hack/control-plane.sh and hack/cluster.sh share --
SA_ISSUER=https://kubernetes.default.svc
API_AUDIENCES=https://kubernetes.default.svc

# make_control_plane_pki SAN: the cluster CA, the front-proxy CA and client
# (aggregation), an admin client (system:masters), the ServiceAccount key
# pair, and kube-apiserver's serving certificate for SAN (openssl
# subjectAltName syntax) plus the `kubernetes` Service's names.
make_control_plane_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  make_ca ca kplug-e2e-cluster-ca
  make_ca front-proxy-ca kplug-e2e-front-proxy-ca
  make_cert apiserver ca "/CN=kube-apiserver" \
    "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" \
    "subjectAltName=$1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  make_client_cert admin ca "/O=system:masters/CN=kubernetes-admin"
  make_client_cert front-proxy-client front-proxy-ca "/CN=front-proxy-client"
  make_service_account_key
  chmod 600 "$PKI"/*.key
}

# kube_apiserver_pki_args: kube-apiserver's flags for the files of
# make_control_plane_pki (serving, client CA, ServiceAccount tokens, the
# front proxy that aggregated API servers like kplug trust), one a line.
kube_apiserver_pki_args() {
  printf '%s\n' \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer="$SA_ISSUER" \
    --api-audiences="$API_AUDIENCES" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=false \
    --profiling=false
}

# start_etcd DATA_DIR LOG CLIENT_PORT PEER_PORT: a one-member etcd on
# loopback, healthy before this returns; sets ETCD_PID. Calls fail_start (the
# caller's) on failure.
start_etcd() {
  local data="$1" logfile="$2" client_url="http://127.0.0.1:$3" peer_url="http://127.0.0.1:$4"
  mkdir -p "$data"
  chmod 700 "$data"
  log "starting etcd on $client_url"
  # All stdio redirected, so callers reading our stdout see EOF.
  (detach etcd \
    --name kplug-e2e \
    --data-dir "$data" \
    --listen-client-urls "$client_url" \
    --advertise-client-urls "$client_url" \
    --listen-peer-urls "$peer_url" \
    --initial-advertise-peer-urls "$peer_url" \
    --initial-cluster "kplug-e2e=$peer_url" \
    --initial-cluster-state new \
    --logger zap --log-level warn) \
    </dev/null >"$logfile" 2>&1 &
  ETCD_PID=$!
  wait_exec "$ETCD_PID" etcd || fail_start "etcd did not start"
  for _ in $(seq 1 300); do
    pid_is "$ETCD_PID" etcd || fail_start "etcd exited"
    curl -fsS -m 2 "$client_url/health" 2>/dev/null | grep -q '"health":"true"' && return 0
    sleep 0.1
  done
  fail_start "etcd not healthy after 30 s"
}

# wait_apiserver_ready URL TIMEOUT PID: polls /readyz as the admin; calls
# fail_start with the checks that fail when the time is up.
wait_apiserver_ready() {
  local url="$1" timeout="$2" pid="$3" deadline
  local auth=(--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")
  deadline=$(( $(date +%s) + timeout ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    pid_is "$pid" kube-apiserver || fail_start "kube-apiserver exited"
    [ "$(curl -sS -m 5 "${auth[@]}" "$url/readyz" 2>/dev/null || true)" = ok ] && return 0
    sleep 0.25
  done
  fail_start "kube-apiserver not ready after ${timeout}s ($(curl -sS -m 5 "${auth[@]}" \
    "$url/readyz?verbose" 2>&1 | grep -v ' ok$' | tr '\n' ' '))"
}
