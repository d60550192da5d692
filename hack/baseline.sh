#!/usr/bin/env bash
# Builds kplug-apiserver at an earlier commit, for benchmarks that compare
# before and after in one run: hack/baseline.sh REV prints the binary's path.
# The build lives in ~/.cache/kplug/baseline/REV (a git worktree with its own
# target directory), so later runs for the same REV take no time.
set -euo pipefail
cd "$(dirname "$0")/.."

rev=$(git rev-parse --short=12 "${1:?usage: hack/baseline.sh REV}^{commit}")
dir="${KPLUG_CACHE:-$HOME/.cache/kplug}/baseline/$rev"
binary="$dir/target/release/kplug-apiserver"
if [[ ! -x "$binary" ]]; then
    if [[ ! -d "$dir/src" ]]; then
        mkdir -p "$dir"
        git worktree add --detach "$dir/src" "$rev" >&2
    fi
    CARGO_TARGET_DIR="$dir/target" cargo build --release --locked \
        --manifest-path "$dir/src/Cargo.toml" -p kplug-apiserver >&2
fi
echo "$binary"
