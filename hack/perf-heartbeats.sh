#!/usr/bin/env bash
# Where kplug's CPU goes on unchanged heartbeats: runs the load bench
# (cargo bench -p kplug-apiserver --bench load) and samples the running
# kplug-apiserver processes with perf (call graphs by DWARF unwinding) only
# while the bench sends its unchanged heartbeats (from its "sending ...
# unchanged heartbeats" line to its "registering ... new plugins" line),
# then prints their samples by shared object, by symbol (self time) and by
# function with its callees (inclusive). The bench's report goes to
# OUT/load.md.
#   cargo build --release -p kplug-apiserver
#   hack/perf-heartbeats.sh [OUT]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
command -v perf >/dev/null || { echo "perf is missing (Debian: linux-perf)" >&2; exit 1; }

cd "$root"
cargo bench -p kplug-apiserver --bench load --no-run >/dev/null 2>&1
perf_pid=""
stop_perf() {
    if [[ -n $perf_pid ]]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" 2>/dev/null || true
        perf_pid=""
    fi
}
trap stop_perf EXIT
while IFS= read -r line; do
    echo "$line" >&2
    if [[ -z $perf_pid && $line == sending*unchanged\ heartbeats* && ! -e "$out/perf.data" ]]; then
        perf record -p "$(pgrep -d, -x kplug-apiserver)" -F 499 --call-graph dwarf,16384 \
            -o "$out/perf.data" >/dev/null 2>"$out/perf.log" &
        perf_pid=$!
    elif [[ -n $perf_pid && $line == registering*new\ plugins* ]]; then
        stop_perf
    fi
done < <(cargo bench -p kplug-apiserver --bench load 2>&1 >"$out/load.md")
stop_perf
[[ -s "$out/perf.data" ]] || { echo "no unchanged heartbeats were sampled" >&2; exit 1; }

report() {
    perf report -i "$out/perf.data" --stdio --percent-limit 1 -g none "$@" 2>/dev/null | grep -v '^#' | grep -v '^$'
}
echo "== kplug-apiserver's samples by shared object"
report --no-children --sort dso
echo "== by symbol, self"
report --no-children --sort symbol
echo "== by function, with its callees"
report --children --sort symbol
echo "== the bench's report: $out/load.md"
