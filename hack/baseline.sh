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
    # From inside the worktree: cargo reads .cargo/config.toml where it runs,
    # and REV is built with its own (the allocator's options are there).
    (cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" cargo build --release --locked \
        -p kplug-apiserver >&2)
fi
echo "$binary"
