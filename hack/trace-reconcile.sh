#!/usr/bin/env bash
# Where a reconcile's time goes, hop by hop, as the kernel saw it: runs the
# reconcile bench (cargo bench -p kplug-apiserver --bench reconcile) and,
# 1 s into its sequential 1 KiB phase, records 2 s of the whole machine's
# scheduler events (switches, wakeups) and socket system calls (writev,
# sendto, recvfrom) with perf. hack/lib/reconcile_hops.py then follows each
# call through kplug, through the relay and direct from the bench's write
# to its read, and prints per hop the median wall time, the CPU time each
# process spent in it and the wakeups of each process's threads. With
# KPLUG_BASELINE=REV (see hack/baseline.sh) the bench also calls kplug built
# at REV, and its calls get a table of their own: before and after in one
# recording. The bench's own report goes to OUT/reconcile.md.
#   cargo build --release -p kplug-apiserver -p kplug-example-hello
#   hack/trace-reconcile.sh [OUT]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
command -v perf >/dev/null || { echo "perf is missing (Debian: linux-perf)" >&2; exit 1; }
events=sched:sched_switch,sched:sched_wakeup
for call in writev sendto recvfrom; do
    events+=",syscalls:sys_enter_$call,syscalls:sys_exit_$call"
done

source "$root/hack/lib/reconcile-bench.sh"
cd "$root"
cargo bench -p kplug-apiserver --bench reconcile --no-run >/dev/null 2>&1
declare -A pid=()
recorded=""
# What the analysis needs to tell processes and connections apart: each
# process's threads ("ROLE PID TID"), its sockets ("PID FD INODE") and
# /proc/net/tcp.
snapshot_processes() {
    local role p fd target task
    : >"$out/threads"
    for role in "${!pid[@]}"; do
        p=${pid[$role]}
        for task in /proc/"$p"/task/*; do echo "$role $p ${task##*/}" >>"$out/threads"; done
        for fd in /proc/"$p"/fd/*; do
            target=$(readlink "$fd" 2>/dev/null) || continue
            [[ $target == socket:* ]] && echo "$p ${fd##*/} ${target//[^0-9]/}"
        done
    done >"$out/sockets"
    cat /proc/net/tcp >"$out/tcp"
}
while IFS= read -r line; do
    echo "$line" >&2
    case "$line" in
        "started the relay (pid "*)
            remember_started "$line"
            pid[bench]=$(ps -o ppid= -p "${pid[relay]}" | tr -d ' ') ;;
        "started "*) remember_started "$line" || true ;;
        timing*sequential\ reconciles\ of\ the\ 1\ KiB*)
            if [[ -z $recorded ]]; then
                recorded=yes
                sleep 1
                snapshot_processes
                perf record -a -e "$events" -o "$out/perf.data" -- sleep 2 >/dev/null 2>"$out/perf.log"
            fi ;;
    esac
done < <(cargo bench -p kplug-apiserver --bench reconcile 2>&1 >"$out/reconcile.md")
[[ -s "$out/perf.data" ]] || { echo "the sequential 1 KiB phase was not recorded" >&2; exit 1; }
perf script -i "$out/perf.data" -F pid,tid,cpu,time,event,trace 2>/dev/null >"$out/events"
python3 "$root/hack/lib/reconcile_hops.py" "$out"
echo "(perf's data, the events and the bench's report are in $out)" >&2
