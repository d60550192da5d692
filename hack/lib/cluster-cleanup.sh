# shellcheck shell=bash
# What `hack/cluster.sh down` removes besides the daemons it recorded, each
# step tolerating that `up` never got that far. Sourced by hack/cluster.sh
# (needs DIR, EGRESS_CHAIN and its helpers).

# Containers: killed through containerd while it still runs, so their shims
# exit and their network namespaces are released.
remove_containers() {
  local sock="$DIR/containerd/containerd.sock" task
  daemon_runs containerd && [ -S "$sock" ] || return 0
  local ctr=(ctr --address "$sock" -n k8s.io)
  for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
    "${ctr[@]}" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
  done
  for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
    "${ctr[@]}" tasks delete -f "$task" >/dev/null 2>&1 || true
  done
}

# Anything still in the pods' cgroups (a shim that outlived containerd, a
# container whose task was not found), and the shims of our containerd.
kill_pod_processes() {
  local procs pid
  procs="$(cat /sys/fs/cgroup/pids/kubepods/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/pids/kubepods/*/*/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/*/*/cgroup.procs 2>/dev/null || true)"
  for pid in $procs $(pgrep -f "containerd-shim-runc-v2 .*-address $DIR/containerd/containerd.sock" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

remove_mounts() {
  local target
  # Deepest first. The pods' network namespaces are bind mounts under
  # /run/netns named cni-*; only our containerd made them (one cluster per
  # machine, and no other CRI runtime here).
  for target in $( { findmnt -rn -o TARGET | grep -E "^$DIR/|^/run/netns/cni-|^/var/run/netns/cni-" || true; } | sort -r); do
    umount -l "$target" 2>/dev/null || true
  done
  rm -f /run/netns/cni-* 2>/dev/null || true
  # libcni's cache of our pods' network results (containerd keeps it there).
  rm -f /var/lib/cni/results/kplug-* /var/lib/cni/results/cni-loopback-*
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
}

remove_pod_cgroups() {
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$hierarchy" ] || continue
    find "$hierarchy" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# kube-proxy's and the kubelet's chains (KUBE-*) and ours, in every table:
# first the rules that jump to them, then the chains.
remove_iptables_rules() {
  local table rule chain
  for table in filter nat mangle; do
    { iptables-save -t "$table" 2>/dev/null | grep -E "^-A [A-Z]+ .*-j (KUBE-|$EGRESS_CHAIN)" | grep -Ev '^-A (KUBE-|KPLUG-)' || true; } |
      while read -r rule; do
        # iptables-save quotes comments the way the shell does.
        eval "iptables -w -t $table ${rule/-A /-D }" 2>/dev/null || true
      done
    for chain in $(iptables-save -t "$table" 2>/dev/null | awk -v egress=":$EGRESS_CHAIN" '$1 ~ /^:KUBE-/ || $1 == egress {print substr($1, 2)}'); do
      iptables -w -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables-save -t "$table" 2>/dev/null | awk -v egress=":$EGRESS_CHAIN" '$1 ~ /^:KUBE-/ || $1 == egress {print substr($1, 2)}'); do
      iptables -w -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}
