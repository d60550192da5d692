# Sourced by the scripts in certs/: kplug_apiserver ARGS... runs
# kplug-apiserver: $KPLUG_APISERVER if set; else `cargo run --release -p
# kplug-apiserver --` when cargo is installed (so it is never stale); else
# target/release/kplug-apiserver; else kplug-apiserver on PATH.
# Needs REPO (the repository root) and die().

if [ -n "${KPLUG_APISERVER:-}" ]; then
  KPLUG_APISERVER_CMD=("$KPLUG_APISERVER")
elif command -v cargo >/dev/null 2>&1 && [ -f "$REPO/Cargo.toml" ]; then
  KPLUG_APISERVER_CMD=(cargo run --release --manifest-path "$REPO/Cargo.toml" -p kplug-apiserver --)
elif [ -x "$REPO/target/release/kplug-apiserver" ]; then
  KPLUG_APISERVER_CMD=("$REPO/target/release/kplug-apiserver")
elif command -v kplug-apiserver >/dev/null 2>&1; then
  KPLUG_APISERVER_CMD=(kplug-apiserver)
else
  KPLUG_APISERVER_CMD=()
fi

kplug_apiserver() {
  [ "${#KPLUG_APISERVER_CMD[@]}" -gt 0 ] || die "kplug-apiserver not found: install Rust (cargo), build it with
  'cargo build --release -p kplug-apiserver', or set KPLUG_APISERVER"
  "${KPLUG_APISERVER_CMD[@]}" "$@"
}
