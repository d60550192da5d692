#!/usr/bin/env bash
# Instructions kplug executes per 1 KiB reconcile, which the machine's load
# does not move: runs KPLUG_BINARY (default target/release/kplug-apiserver)
# standalone under valgrind's callgrind with the release hello plugin, sends
# 50 and then 550 reconciles over one HTTP/2 connection (curl) in two runs,
# and prints (I550 - I50) / 500. Compare two builds by running it for each,
# e.g. with a baseline from hack/baseline.sh REV.
#   cargo build --release -p kplug-apiserver -p kplug-example-hello
#   hack/callgrind-reconcile.sh [KPLUG_BINARY]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/kplug-apiserver}"
plugin="$root/target/release/hello-plugin"

total() { # N: instructions of one run with N reconciles
    local n=$1 dir api grpc port url kp pp
    dir=$(mktemp -d)
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "$bin" standalone \
        --state-dir "$dir" --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 --log warn \
        --max-heartbeat-interval 5m >"$dir/out" 2>"$dir/err" &
    kp=$!
    for _ in $(seq 1 600); do grep -q "kplug is serving" "$dir/out" 2>/dev/null && break; sleep 0.2; done
    api=$(grep -o 'https://[0-9.:]*' "$dir/out" | head -1)
    grpc=$(grep -o 'grpc://[0-9.:]*' "$dir/out" | head -1 | sed 's#grpc://#http://#')
    python3 - "$dir" <<'PY'
import base64, re, sys
d = sys.argv[1]
kubeconfig = open(d + "/kubeconfig").read()
for key, name in [("certificate-authority-data", "ca"), ("client-certificate-data", "cert"), ("client-key-data", "key")]:
    open(f"{d}/{name}.pem", "wb").write(base64.b64decode(re.search(key + r": (\S+)", kubeconfig).group(1)))
obj = {"apiVersion": "example.com/v1", "kind": "Greeting",
       "metadata": {"name": "bench-object", "namespace": "default"}, "spec": {"padding": "p" * 800}}
import json
open(d + "/body.json", "w").write(json.dumps({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {"object": obj}}))
PY
    port=$((20000 + RANDOM % 20000))
    RUST_LOG=warn "$plugin" --registry "$grpc" --name bench --listen "127.0.0.1:$port" \
        --heartbeat-interval 300 >/dev/null 2>&1 &
    pp=$!
    url="$api/apis/plugins.kplug.io/v1alpha1/plugins/bench/reconcile"
    local args=(-s -w '%{http_code}\n' --http2 --cacert "$dir/ca.pem" --cert "$dir/cert.pem"
        --key "$dir/key.pem" -H 'Content-Type: application/json' --data-binary "@$dir/body.json")
    for _ in $(seq 1 300); do
        [[ $(curl "${args[@]}" -o /dev/null "$url") == 201 ]] && break
        sleep 0.5
    done
    local urls=()
    for _ in $(seq 1 "$n"); do urls+=(-o /dev/null "$url"); done
    local answered
    answered=$(curl "${args[@]}" "${urls[@]}" | grep -c '^201$' || true)
    kill "$pp"; kill -INT "$kp"; wait "$kp" || true
    [[ $answered == "$n" ]] || { echo "only $answered of $n reconciles answered 201" >&2; exit 1; }
    grep -E '^summary:' "$dir/cg.out" | awk '{print $2}'
    rm -rf "$dir"
}

small=$(total 50)
large=$(total 550)
echo "$bin: $(( (large - small) / 500 )) instructions per reconcile"
