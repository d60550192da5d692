#!/usr/bin/env bash
# A real single-node Kubernetes v1.20.2 on this machine, for kplug's tests:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd
# (runc, CNI bridge), kubelet, kube-proxy (iptables) and the test cluster's
# DNS (hack/cluster-dns: a stand-in for CoreDNS).
#
#   hack/cluster.sh up      # start it; prints the admin kubeconfig's path
#   hack/cluster.sh down    # stop it and remove everything `up` made
#   hack/cluster.sh env     # shell-sourceable settings of the running cluster
#   hack/cluster.sh status  # exit 0 if every daemon runs
#   hack/cluster.sh stop DAEMON   # SIGTERM one daemon and wait until it exited
#                                 # (the kubelet's pods keep running)
#   hack/cluster.sh start DAEMON  # start it again as `up` did (its .args),
#                                 # output appended to its log
#
# KPLUG_CLUSTER_KUBELET_EXTRA_ARGS adds (word-split) kubelet flags.
#
# One cluster per machine, as root. State (certificates, etcd, containerd's
# and the kubelet's folders, every daemon's log under logs/) lives in
# KPLUG_CLUSTER_DIR (default /var/lib/kplug-cluster); Kubernetes binaries come
# from hack/kube-build.sh (built once, cached under ~/.cache/kplug). The node
# is `kplug-node` at 10.244.0.1, the gateway of the pods' bridge kplug0
# (pods 10.244.0.0/24, Services 10.96.0.0/24, cluster DNS 10.96.0.10, domain
# cluster.local). Images cannot be pulled: the pause image is built from the
# same source, a busybox toolbox image (kplug.local/toolbox:1) is made for
# tests, and kplug's images are imported (hack/images.sh load).
#
# Nothing the cluster runs sends a packet off this machine:
#   - FORWARD drops anything from the pods' bridge to another interface
#     (chain KPLUG-CLUSTER-EGRESS; its counters show any attempt);
#   - the Service range is routed to the bridge, never to the default route;
#   - pods resolve only through the cluster DNS, which forwards nothing, and
#     the kubelet gives them no host resolver or search domains;
#   - containerd's registry hosts all point at a closed loopback port, so an
#     image pull fails at once instead of leaving the machine;
#   - the kubelet's cloud credential lookup (169.254.169.254) is switched off.
#
# down undoes up in reverse, even after a failed up: daemons by recorded
# PID, containers and their shims, pod network namespaces, mounts under the
# state folder, the pods' cgroups, kube-proxy's, the kubelet's and our
# iptables rules, the bridge and route, and the sysctls up changed.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX=cluster
# shellcheck source=hack/lib/common.sh
. "$HACK_DIR/lib/common.sh"
# shellcheck source=hack/lib/cluster-images.sh
. "$HACK_DIR/lib/cluster-images.sh"
# shellcheck source=hack/lib/cluster-cleanup.sh
. "$HACK_DIR/lib/cluster-cleanup.sh"

DIR="${KPLUG_CLUSTER_DIR:-/var/lib/kplug-cluster}"
# Every daemon, `up` or `start`: kubelet 1.20's built-in AWS credential
# provider otherwise calls 169.254.169.254, off the machine.
export AWS_EC2_METADATA_DISABLED=true
PKI="$DIR/pki"
LOGS="$DIR/logs"
# One cluster per machine (fixed ports, one bridge), whatever DIR is.
UP_LOCK=/run/lock/kplug-cluster-up.lock
NODE_NAME=kplug-node
BRIDGE=kplug0
POD_CIDR=10.244.0.0/24
NODE_IP=10.244.0.1
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1 # the `kubernetes` Service
DNS_SERVICE_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
API_PORT=6443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
# The ports `up` binds: kubelet (10248 healthz, 10250), kube-proxy (10249
# metrics, 10256 healthz), kube-controller-manager 10257, kube-scheduler 10259.
FIXED_PORTS=(6443 10248 10249 10250 10256 10257 10259 12379 12380)
EGRESS_CHAIN=KPLUG-CLUSTER-EGRESS
# Daemons in start order; down stops them in reverse.
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kplug-cluster-dns)

usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

pid_file() { echo "$DIR/pids/$1"; }
recorded_pid() { cat "$(pid_file "$1")" 2>/dev/null || true; }
daemon_runs() { pid_is "$(recorded_pid "$1")" "$1"; }

# launch NAME new|append BINARY ARGS...: BINARY detached (common.sh), its
# output in $LOGS/NAME.log (a new log, or appended to), its PID in
# $DIR/pids/NAME; fails when it did not exec.
launch() {
  local name="$1" mode="$2" bin="$3" log_file="$LOGS/$1.log"; shift 3
  [ "$mode" = append ] || : >"$log_file"
  (detach "$bin" "$@") </dev/null >>"$log_file" 2>&1 &
  local pid=$!
  echo "$pid" >"$(pid_file "$name")"
  wait_exec "$pid" "$(basename "$bin")"
}

# start_daemon NAME BINARY ARGS...: launches it as `up` does, recording its
# command line in $LOGS/NAME.args for `start`.
start_daemon() {
  local name="$1" bin="$2"; shift 2
  printf '%s\n' "$bin" "$@" >"$LOGS/$name.args"
  log "starting $name"
  launch "$name" new "$bin" "$@" || fail_start "$name did not start" "$name"
}

# fail_start MESSAGE [DAEMON]: says what failed, shows the last lines of
# DAEMON's log (or of every daemon's), and undoes what this `up` did.
fail_start() {
  log "$1"
  local f logs=("$LOGS"/*.log)
  [ -z "${2:-}" ] || logs=("$LOGS/$2.log")
  for f in "${logs[@]}"; do
    if [ ! -f "$f" ] || [ "$(basename "$f")" = audit.log ]; then continue; fi
    # A Go daemon's fatal error ends in a goroutine dump: its first errors
    # say more than its last lines.
    log "--- first errors in $f ---"
    grep -m 8 -E '^[EF][0-9]{4} |^Error|level=(error|fatal)|"level":"(error|fatal)"' "$f" >&2 || true
    log "--- last 15 lines of $f ---"
    tail -n 15 "$f" >&2
  done
  log "cleaning up (hack/cluster.sh down)"
  cmd_down >&2 || true
  exit 1
}

# wait_for WHAT TIMEOUT COMMAND...: polls COMMAND every 0.25 s; fail_start
# after TIMEOUT seconds. Every daemon must keep running meanwhile.
wait_for() {
  local what="$1" timeout="$2" deadline name; shift 2
  deadline=$(( $(date +%s) + timeout ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    for name in "${STARTED[@]}"; do daemon_runs "$name" || fail_start "$name exited while waiting for $what" "$name"; done
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  fail_start "$what: not after ${timeout}s"
}

# --- preflight: fail at once, saying which and what to do ---------------------
preflight() {
  [ "$(id -u)" = 0 ] || die "must run as root (it creates a bridge, iptables rules, mounts and cgroups): run it with sudo"
  # Two ups started together would both pass the checks below before
  # either has started anything: the first holds this lock until it exits
  # (its daemons do not inherit it: detach in common.sh), the second is
  # refused.
  mkdir -p "${UP_LOCK%/*}"
  exec {UP_LOCK_FD}>"$UP_LOCK"
  flock -n "$UP_LOCK_FD" || die "another hack/cluster.sh up is starting a cluster (it holds $UP_LOCK): wait for it, then use that cluster (hack/cluster.sh env)"
  local name
  for name in "${DAEMONS[@]}"; do
    if daemon_runs "$name"; then
      die "a cluster is already running from $DIR ($name, pid $(recorded_pid "$name")): use it (hack/cluster.sh env) or stop it first (hack/cluster.sh down)"
    fi
  done
  [ ! -e "$DIR/up.started" ] || die "a previous up left state in $DIR: run hack/cluster.sh down first"
  local missing=()
  for name in etcd containerd runc iptables iptables-save ip conntrack openssl curl gcc kubectl python3; do
    command -v "$name" >/dev/null || missing+=("$name")
  done
  [ -x /usr/lib/cni/bridge ] || missing+=("/usr/lib/cni/bridge")
  [ -x /bin/busybox ] || missing+=("/bin/busybox")
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: run hack/setup.sh (it apt-installs containerd, runc, containernetworking-plugins, iptables, conntrack, etcd-server, gcc, busybox-static)"
  local controller
  for controller in cpu cpuacct cpuset memory pids devices freezer; do
    [ -d "/sys/fs/cgroup/$controller" ] || [ -f /sys/fs/cgroup/cgroup.controllers ] ||
      die "cgroup controller '$controller' is not mounted under /sys/fs/cgroup: the kubelet needs cgroups (mount the cgroup v1 hierarchies or cgroup v2)"
  done
  [ -f /proc/sys/net/bridge/bridge-nf-call-iptables ] ||
    die "/proc/sys/net/bridge/bridge-nf-call-iptables is missing: load br_netfilter (modprobe br_netfilter); Services between pods need it"
  local port taken=()
  for port in "${FIXED_PORTS[@]}"; do
    [ -z "$(ss -Htanl "( sport = :$port )" 2>/dev/null)" ] || taken+=("$port")
  done
  if ss -Huanl "( sport = :53 )" 2>/dev/null | grep -qF "$NODE_IP"; then taken+=("$NODE_IP:53/udp"); fi
  [ ${#taken[@]} -eq 0 ] || die "port(s) ${taken[*]} already in use ($(ss -Htanlp "( sport = :${taken[0]%%[:/]*} )" 2>/dev/null | awk '{print $NF}' | head -1)): stop what listens there; the cluster needs ${FIXED_PORTS[*]}"
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || die "network interface $BRIDGE exists already: a cluster was not torn down (hack/cluster.sh down) or another program owns it"
  local cidr
  for cidr in "$POD_CIDR" "$SERVICE_CIDR"; do
    if ip -4 route show to match "${cidr%/*}" | grep -qv '^default' || [ -n "$(ip -4 route show root "$cidr")" ]; then
      die "subnet $cidr is in use on this machine ($(ip -4 route show to match "${cidr%/*}" | grep -v '^default' | head -1)): the cluster needs it for its $( [ "$cidr" = "$POD_CIDR" ] && echo pods || echo Services)"
    fi
  done
}

# --- pieces -------------------------------------------------------------------
make_pki() {
  make_control_plane_pki "IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP"
  make_client_cert kube-controller-manager ca "/CN=system:kube-controller-manager"
  make_client_cert kube-scheduler ca "/CN=system:kube-scheduler"
  make_client_cert kube-proxy ca "/CN=system:kube-proxy"
  make_client_cert kubelet ca "/O=system:nodes/CN=system:node:$NODE_NAME"
  make_client_cert kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client"
  make_client_cert cluster-dns ca "/CN=kplug-cluster-dns"
  chmod 600 "$PKI"/*.key
  local who
  for who in admin kube-controller-manager kube-scheduler kube-proxy kubelet cluster-dns; do
    write_kubeconfig "https://$NODE_IP:$API_PORT" "$who" "$DIR/$who.kubeconfig"
  done
}

setup_network() {
  # Remember what we change, so down puts it back.
  sysctl -n net.ipv4.ip_forward >"$DIR/sysctl.ip_forward"
  cat /proc/sys/net/bridge/bridge-nf-call-iptables >"$DIR/sysctl.bridge-nf-call-iptables"
  ip link add "$BRIDGE" type bridge
  touch "$DIR/made.bridge"
  ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
  sysctl -qw net.ipv4.ip_forward=1
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  iptables -w -N "$EGRESS_CHAIN"
  touch "$DIR/made.egress-chain"
  iptables -w -A "$EGRESS_CHAIN" -o "$BRIDGE" -j RETURN
  iptables -w -A "$EGRESS_CHAIN" -j DROP
  iptables -w -I FORWARD 1 -i "$BRIDGE" -j "$EGRESS_CHAIN"

  mkdir -p "$DIR/cni/net.d" "$DIR/cni/ipam"
  cat >"$DIR/cni/net.d/10-kplug.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kplug",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

start_containerd() {
  mkdir -p "$DIR/containerd/certs.d/_default"
  # Every registry host resolves to a closed loopback port: a pull fails at
  # once and never leaves the machine.
  cat >"$DIR/containerd/certs.d/_default/hosts.toml" <<EOF
server = "http://127.0.0.1:9"
[host."http://127.0.0.1:9"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: runc may not lower a process's oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$DIR/containerd/certs.d"
EOF
  start_daemon containerd "$(command -v containerd)" --config "$DIR/containerd/config.toml"
  STARTED+=(containerd)
  wait_for "containerd's socket" 30 ctr --address "$DIR/containerd/containerd.sock" version
  import_cluster_images
}

start_control_plane() {
  local bin_dir="$1" api_url="https://$NODE_IP:$API_PORT"
  start_etcd "$DIR/etcd" "$LOGS/etcd.log" "$ETCD_PORT" "$ETCD_PEER_PORT"
  echo "$ETCD_PID" >"$(pid_file etcd)"
  STARTED+=(etcd)

  # shellcheck disable=SC2054 # the commas are inside flags' values
  local args=(
    --advertise-address="$NODE_IP"
    --bind-address="$NODE_IP"
    --secure-port="$API_PORT"
    --insecure-port=0
    --cert-dir="$PKI"
    --etcd-servers="http://127.0.0.1:$ETCD_PORT"
    --authorization-mode=Node,RBAC
    --enable-admission-plugins=NodeRestriction
    --allow-privileged=true
    --service-cluster-ip-range="$SERVICE_CIDR"
    --kubelet-client-certificate="$PKI/kubelet-client.crt"
    --kubelet-client-key="$PKI/kubelet-client.key"
    --kubelet-preferred-address-types=InternalIP
    --audit-log-path="$LOGS/audit.log"
    --audit-policy-file="$DIR/audit-policy.yaml"
  )
  mapfile -t -O "${#args[@]}" args < <(kube_apiserver_pki_args)
  # Writes only (what a drill counts), with who made them.
  cat >"$DIR/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
EOF
  start_daemon kube-apiserver "$bin_dir/kube-apiserver" "${args[@]}"
  STARTED+=(kube-apiserver)
  wait_apiserver_ready "$api_url" 90 "$(recorded_pid kube-apiserver)"

  start_daemon kube-controller-manager "$bin_dir/kube-controller-manager" \
    --kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --port=0 \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --allocate-node-cidrs=false \
    --controllers='*,-cloud-node-lifecycle,-route,-service'
  STARTED+=(kube-controller-manager)
  start_daemon kube-scheduler "$bin_dir/kube-scheduler" \
    --kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --port=0 \
    --leader-elect=false
  STARTED+=(kube-scheduler)
}

start_node() {
  local bin_dir="$1"
  mkdir -p "$DIR/kubelet"
  # An empty resolv.conf: pods get the cluster DNS and no host resolver or
  # host search domain.
  : >"$DIR/kubelet/resolv.conf"
  cat >"$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: $DIR/kubelet/resolv.conf
failSwapOn: false
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
serializeImagePulls: false
# Every pod is synced each 10 s (the default is 1 min), and with it the
# Secrets and ConfigMaps it mounts: a change reaches the pods in seconds.
# The plugin CA's rotation drill waits for three such changes.
syncFrequency: 10s
EOF
  local extra=()
  read -ra extra <<<"${KPLUG_CLUSTER_KUBELET_EXTRA_ARGS:-}"
  start_daemon kubelet "$bin_dir/kubelet" \
    --config="$DIR/kubelet/config.yaml" \
    --kubeconfig="$DIR/kubelet.kubeconfig" \
    --container-runtime=remote \
    --container-runtime-endpoint="unix://$DIR/containerd/containerd.sock" \
    --pod-infra-container-image="$PAUSE_IMAGE" \
    --root-dir="$DIR/kubelet" \
    --cert-dir="$DIR/kubelet/pki" \
    --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" \
    "${extra[@]}"
  STARTED+=(kubelet)
  start_daemon kube-proxy "$bin_dir/kube-proxy" \
    --kubeconfig="$DIR/kube-proxy.kubeconfig" \
    --hostname-override="$NODE_NAME" \
    --proxy-mode=iptables \
    --cluster-cidr="$POD_CIDR" \
    --nodeport-addresses="$NODE_IP/32" \
    --bind-address=127.0.0.1 \
    --healthz-bind-address=127.0.0.1:10256 \
    --metrics-bind-address=127.0.0.1:10249 \
    --conntrack-max-per-core=0
  STARTED+=(kube-proxy)
}

start_dns() {
  local bin
  bin="$(cluster_dns_binary)"
  # The Service pods are pointed at, backed by the DNS server on the node.
  kubectl --kubeconfig "$DIR/admin.kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_SERVICE_IP
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
subsets:
- addresses: [{ip: $NODE_IP}]
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "kplug:cluster-dns"}
rules:
- apiGroups: [""]
  resources: [services, endpoints]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kplug:cluster-dns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "kplug:cluster-dns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kplug-cluster-dns}]
EOF
  start_daemon kplug-cluster-dns "$bin" \
    --kubeconfig "$DIR/cluster-dns.kubeconfig" \
    --listen "$NODE_IP:53" \
    --domain "$CLUSTER_DOMAIN"
  STARTED+=(kplug-cluster-dns)
}

# The DNS server is one of the workspace's binaries; built on demand.
cluster_dns_binary() {
  local root; root="$(cd "$HACK_DIR/.." && pwd)"
  (cd "$root" && cargo build --quiet --locked -p kplug-cluster-dns >&2)
  echo "${CARGO_TARGET_DIR:-$root/target}/debug/kplug-cluster-dns"
}

dns_answers() {
  local name="$1"
  # A real lookup through the cluster DNS, over its Service IP as pods do.
  python3 - "$DNS_SERVICE_IP" "$name" <<'PY'
import socket, struct, sys, random
server, name = sys.argv[1], sys.argv[2]
qid = random.randrange(65536)
query = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
s.sendto(query, (server, 53))
reply = s.recv(512)
rcode = reply[3] & 0xF
answers = struct.unpack(">H", reply[6:8])[0]
sys.exit(0 if rcode == 0 and answers > 0 else 1)
PY
}

write_env() {
  q() { printf '%q' "$1"; }
  cat >"$DIR/env.tmp" <<EOF
# Written by hack/cluster.sh up; source it (or: eval "\$(hack/cluster.sh env)").
KPLUG_CLUSTER_DIR=$(q "$DIR")
KUBECONFIG=$(q "$DIR/admin.kubeconfig")
KPLUG_CLUSTER_KUBECONFIG=$(q "$DIR/admin.kubeconfig")
KPLUG_CLUSTER_API_URL=https://$NODE_IP:$API_PORT
KPLUG_CLUSTER_NODE_NAME=$NODE_NAME
KPLUG_CLUSTER_NODE_IP=$NODE_IP
KPLUG_CLUSTER_POD_CIDR=$POD_CIDR
KPLUG_CLUSTER_SERVICE_CIDR=$SERVICE_CIDR
KPLUG_CLUSTER_DNS_IP=$DNS_SERVICE_IP
KPLUG_CLUSTER_DOMAIN=$CLUSTER_DOMAIN
KPLUG_CLUSTER_LOGS=$(q "$LOGS")
KPLUG_CLUSTER_AUDIT_LOG=$(q "$LOGS/audit.log")
KPLUG_CLUSTER_PKI_DIR=$(q "$PKI")
KPLUG_CLUSTER_CA_CERT=$(q "$PKI/ca.crt")
KPLUG_CLUSTER_EGRESS_CHAIN=$EGRESS_CHAIN
KPLUG_CLUSTER_BRIDGE=$BRIDGE
KPLUG_CLUSTER_TOOLBOX_IMAGE=$TOOLBOX_IMAGE
CONTAINERD_ADDRESS=$(q "$DIR/containerd/containerd.sock")
CONTAINERD_NAMESPACE=k8s.io
export KUBECONFIG CONTAINERD_ADDRESS CONTAINERD_NAMESPACE
EOF
  mv -f "$DIR/env.tmp" "$DIR/env"
}

cmd_up() {
  preflight
  local bin_dir t0
  t0=$(date +%s%N)
  bin_dir="$("$HACK_DIR/kube-build.sh" --dir)"
  mkdir -p "$DIR" "$LOGS" "$DIR/pids"
  chmod 700 "$DIR"
  # From here on, down has something to undo.
  touch "$DIR/up.started"
  STARTED=()
  trap 'fail_start "interrupted"' INT TERM
  make_pki
  setup_network
  start_containerd
  start_control_plane "$bin_dir"
  start_node "$bin_dir"
  local k=(kubectl --kubeconfig "$DIR/admin.kubeconfig")
  wait_for "node $NODE_NAME Ready" 120 \
    sh -c "${k[*]} get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  start_dns
  wait_for "the cluster DNS answering for kubernetes.default.svc.$CLUSTER_DOMAIN" 60 \
    dns_answers "kubernetes.default.svc.$CLUSTER_DOMAIN"
  wait_for "the default ServiceAccount" 60 "${k[@]}" -n default get serviceaccount default
  write_env
  trap - INT TERM
  log "ready in $(( ($(date +%s%N) - t0) / 1000000 )) ms; logs in $LOGS; eval \"\$(hack/cluster.sh env)\""
  echo "$DIR/admin.kubeconfig"
}

# --- down ---------------------------------------------------------------------
# Each step tolerates that up never got that far.
cmd_down() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  local i name
  for (( i=${#DAEMONS[@]}-1; i>=0; i-- )); do
    name="${DAEMONS[$i]}"
    [ "$name" = containerd ] && remove_containers
    stop_pid "$(recorded_pid "$name")" "$name"
  done
  kill_pod_processes
  remove_mounts
  remove_pod_cgroups
  remove_iptables_rules
  if [ -e "$DIR/made.bridge" ] || ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" 2>/dev/null || true
  fi
  [ -f "$DIR/sysctl.ip_forward" ] && sysctl -qw net.ipv4.ip_forward="$(cat "$DIR/sysctl.ip_forward")"
  [ -f "$DIR/sysctl.bridge-nf-call-iptables" ] && cat "$DIR/sysctl.bridge-nf-call-iptables" >/proc/sys/net/bridge/bridge-nf-call-iptables
  rm -rf "$DIR"
  log "down: nothing of the cluster is left"
}

cmd_env() {
  [ -f "$DIR/env" ] || die "no cluster is up ($DIR/env missing): run hack/cluster.sh up"
  cat "$DIR/env"
}

cmd_status() {
  local name ok=0
  for name in "${DAEMONS[@]}"; do
    if daemon_runs "$name"; then log "$name running ($(recorded_pid "$name"))"; else log "$name not running"; ok=1; fi
  done
  return $ok
}

# known_daemon NAME: dies unless NAME is one of DAEMONS.
known_daemon() {
  local name
  for name in "${DAEMONS[@]}"; do [ "$name" != "$1" ] || return 0; done
  die "no daemon $1: one of ${DAEMONS[*]}"
}

cmd_stop() {
  known_daemon "$1"
  [ -f "$DIR/env" ] || die "no cluster is up ($DIR/env missing)"
  daemon_runs "$1" || die "$1 is not running"
  stop_pid "$(recorded_pid "$1")" "$1"
}

cmd_start() {
  known_daemon "$1"
  [ -f "$DIR/env" ] || die "no cluster is up ($DIR/env missing): hack/cluster.sh up"
  ! daemon_runs "$1" || die "$1 is already running ($(recorded_pid "$1"))"
  local command=()
  mapfile -t command <"$LOGS/$1.args" || die "no command line of $1 ($LOGS/$1.args)"
  log "starting $1 again (output appended to $LOGS/$1.log)"
  if ! launch "$1" append "${command[@]}"; then
    log "--- last 15 lines of $LOGS/$1.log ---"
    tail -n 15 "$LOGS/$1.log" >&2
    die "$1 did not start"
  fi
  log "$1 running ($(recorded_pid "$1"))"
}

case "${1:-}:$#" in
  up:1) cmd_up ;;
  down:1) cmd_down ;;
  env:1) cmd_env ;;
  status:1) cmd_status ;;
  stop:2) cmd_stop "$2" ;;
  start:2) cmd_start "$2" ;;
  *) usage ;;
esac
