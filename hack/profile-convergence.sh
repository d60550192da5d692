#!/usr/bin/env bash
# Where kube-apiserver's CPU goes while the operator converges its objects,
# against the raw writes of the bound and the operator's requests replayed
# without it: runs the convergence bench (cargo bench -p kplug-operator
# --bench convergence) with kube-apiserver's profiling on, takes a CPU
# profile of it (Go's pprof, /debug/pprof/profile as the admin) from the
# start of each of these phases, and prints, per profile, the CPU seconds
# under the functions that tell the requests apart: creates, updates (and of
# them the status writes), watches, client certificates, the reconciles it
# proxies, garbage collection. The bench's report goes to OUT/convergence.md;
# the profiles to OUT/*.pprof (go tool pprof -top OUT/operator.pprof).
#   cargo build --release -p kplug-apiserver -p kplug-operator -p kplug-example-hello
#   hack/profile-convergence.sh [OUT]
# Profiling slows kube-apiserver a little: the figures of this run are for
# reading the profiles beside, not for BENCHMARKS.md's ratios.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
command -v go >/dev/null || { echo "go is missing (hack/kube-build.sh installs it)" >&2; exit 1; }

# The phase a line of the bench's progress starts, and how long to profile
# it: the raw writes (its 4 s, shorter than the four phases of 1,000
# requests, end before the operator's run starts: kube-apiserver takes one
# profile at a time), the operator's 1,000 objects, and the replay with the
# run's two watches.
phase_of() {
  case "$1" in
    "raw creates:"*) echo "raw 4" ;;
    "widget objects for the operator:"*) echo "operator 8" ;;
    "the same, two watches open"*) echo "replayed 8" ;;
  esac
}

cd "$root"
cargo bench -p kplug-operator --bench convergence --no-run >/dev/null 2>&1
pids=()
while IFS= read -r line; do
  echo "$line" >&2
  read -r name seconds < <(phase_of "$line") || continue
  kubeconfig="$(ls -td /tmp/kplug-bench-operator-*/cp | head -n1)/admin.kubeconfig"
  kubectl --kubeconfig "$kubeconfig" get --raw "/debug/pprof/profile?seconds=$seconds" \
    >"$out/$name.pprof" 2>"$out/$name.err" &
  pids+=($!)
done < <(KPLUG_CP_APISERVER_EXTRA_ARGS=--profiling=true \
  cargo bench -p kplug-operator --bench convergence 2>&1 >"$out/convergence.md")
# A failed profile is reported below, with what kubectl said.
for pid in "${pids[@]}"; do wait "$pid" || true; done

# Cumulative seconds under each function (the end of its full name), per
# profile.
functions=(
  'registry.(*Store).Create'
  'registry.(*Store).Update'
  'customresource.(*StatusREST).Update'
  'handlers.serveWatch'
  'etcd3.(*watchChan).processEvent'
  'x509.(*Authenticator).AuthenticateRequest'
  'proxy.(*UpgradeAwareHandler).ServeHTTP'
  'runtime.gcBgMarkWorker'
)
for name in raw operator replayed; do
  [[ -s "$out/$name.pprof" ]] || { echo "no profile of $name: $(cat "$out/$name.err")" >&2; exit 1; }
  echo "== $name: $(go tool pprof -top "$out/$name.pprof" 2>/dev/null | grep -m1 'Total samples')"
  for f in "${functions[@]}"; do
    go tool pprof -top -cum -nodecount=100000 "$out/$name.pprof" 2>/dev/null |
      awk -v f="$f" 'substr($NF, length($NF) - length(f) + 1) == f { printf "%10s %7s  %s\n", $4, $5, f; exit }'
  done
done
echo "== the bench's report: $out/convergence.md"
