#!/usr/bin/env bash
# Where kplug's CPU per reconcile goes beside the relay's, by crate: runs
# the reconcile bench (cargo bench -p kplug-apiserver --bench reconcile)
# and samples kplug and the relay with perf (cpu-clock, no call graphs) in
# two phases where both carry the same calls: the sequential calls of the
# 1 KiB object (one at a time, goal 2's latency), and its throughput phase
# over one connection (32 in flight). hack/lib/profile_by_crate.py charges
# each sample to the crate of the function it hit and prints microseconds
# per reconcile. With KPLUG_BASELINE=REV (hack/baseline.sh) the baseline
# build is sampled too. The bench's own report goes to OUT/reconcile.md.
#   cargo build --release -p kplug-apiserver -p kplug-example-hello
#   hack/profile-reconcile.sh [OUT]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
command -v perf >/dev/null || { echo "perf is missing (Debian: linux-perf)" >&2; exit 1; }
# Samples per second of CPU: about 15,000 per process and phase.
frequency=2999

source "$root/hack/lib/reconcile-bench.sh"
cd "$root"
cargo bench -p kplug-apiserver --bench reconcile --no-run >/dev/null 2>&1
declare -A pid=()
phase=""
recorder=""
recorded=()
# The processes sampled: kplug, the baseline build if any, and the relay.
proxies() {
    local role
    for role in kplug baseline relay; do
        [[ -v pid[$role] ]] && echo "$role"
    done
}
# Their user + system time in clock ticks, as "ROLE TICKS" lines.
cpu_ticks() {
    local role
    for role in $(proxies); do
        echo "$role $(awk '{print $14 + $15}' "/proc/${pid[$role]}/stat")"
    done
}
record() {
    local role targets=()
    phase=$1
    cpu_ticks >"$out/$phase.cpu-before"
    : >"$out/pids"
    for role in $(proxies); do
        echo "$role ${pid[$role]}" >>"$out/pids"
        targets+=("${pid[$role]}")
    done
    perf record -F "$frequency" -p "$(IFS=,; echo "${targets[*]}")" -o "$out/$phase.data" \
        >"$out/$phase.log" 2>&1 &
    recorder=$!
}
stop() {
    if [[ -n $recorder ]]; then
        cpu_ticks >"$out/$phase.cpu-after"
        kill -INT "$recorder"
        wait "$recorder" || true
        recorded+=("$phase")
        recorder=""
    fi
}
printf 'frequency %s\nclock_ticks %s\n' "$frequency" "$(getconf CLK_TCK)" >"$out/recording"
while IFS= read -r line; do
    echo "$line" >&2
    case "$line" in
        "started "*) remember_started "$line" || true ;;
        "timing "*" sequential reconciles of the 1 KiB object per route, after "*" untimed")
            read -r timed untimed < <(grep -o '[0-9]\+' <<<"$line" | sed -n '1p;3p' | paste -sd' ')
            echo "sequential_calls $((timed + untimed))" >>"$out/recording"
            record sequential ;;
        "timing "*" sequential reconciles of the 64 KiB object"*) stop ;;
        *"timing "*" of the 1 KiB object "*" over 1 connection(s)")
            [[ -n $recorder ]] || record throughput ;;
        *"timing "*" over 4 connection(s)") stop ;;
    esac
done < <(cargo bench -p kplug-apiserver --bench reconcile 2>&1 >"$out/reconcile.md")
[[ ${#recorded[@]} -eq 2 ]] || { echo "recorded only: ${recorded[*]:-nothing}" >&2; exit 1; }
for phase in "${recorded[@]}"; do
    perf script -i "$out/$phase.data" -G -F pid,ip,sym,dso 2>/dev/null >"$out/$phase.samples"
done
python3 "$root/hack/lib/profile_by_crate.py" "$out"
echo "(perf's data, the samples and the bench's report are in $out)" >&2
