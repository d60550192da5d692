#!/usr/bin/env bash
# Fuzzes kplug's parsers of untrusted input with libFuzzer (cargo-fuzz):
# the fuzz targets in fuzz/fuzz_targets, each calling one entry point of
# apiserver/src/fuzzing.rs.
#
#   hack/fuzz.sh [TARGET|all] [SECONDS]   # default: all, 60 s each
#   hack/fuzz.sh list                      # the targets
#   hack/fuzz.sh smoke [SECONDS]           # every target, 3 s each (hack/test.sh)
#
# Each run starts from the committed seeds (fuzz/seeds/TARGET, taken from
# the tests) and the corpus earlier runs grew (fuzz/corpus/TARGET, not
# committed). A crash is written to fuzz/artifacts/TARGET and fails the
# run; make it a test (fuzz/regressions/TARGET/, replayed by `cargo test`)
# once it is fixed. Runs on the machine's stable toolchain (RUSTC_BOOTSTRAP
# lets cargo-fuzz pass its sanitizer flags); cargo-fuzz is installed under
# ~/.cache/kplug. The first build takes about 7 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

# smoke: the same fuzz targets built as a plain dev build (no sanitizer, no
# coverage instrumentation, in the workspace's target/ so that its
# dependencies are reused: about 20 s after the workspace's build), each run
# by libFuzzer for SECONDS over its seeds and past failures. Without coverage
# libFuzzer only mutates at random: this keeps the targets compiling and
# their inputs passing, it is not fuzzing. New inputs go to a temporary
# directory, never to the committed ones.
if [ "${1:-}" = smoke ]; then
  seconds="${2:-3}"
  target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
  echo "== fuzz targets: smoke build" >&2
  CARGO_TARGET_DIR="$target_dir" cargo build --quiet --manifest-path fuzz/Cargo.toml --locked
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  failed=()
  for source in fuzz/fuzz_targets/*.rs; do
    target=$(basename "$source" .rs)
    mkdir -p "$scratch/$target"
    inputs=("fuzz/seeds/$target")
    [ -d "fuzz/regressions/$target" ] && inputs+=("fuzz/regressions/$target")
    if ! "$target_dir/debug/$target" "$scratch/$target" "${inputs[@]}" \
      -max_total_time="$seconds" -max_len=4096 -artifact_prefix="$scratch/$target-" >"$scratch/$target.log" 2>&1; then
      echo "fuzz target $target failed its smoke run:" >&2
      tail -40 "$scratch/$target.log" >&2
      # The input that failed, kept where the full runs keep theirs.
      mkdir -p "fuzz/artifacts/$target"
      cp "$scratch/$target"-* "fuzz/artifacts/$target/" 2>/dev/null || true
      failed+=("$target")
    else
      echo "== $target: $(grep -o 'Done [0-9]* runs' "$scratch/$target.log")" >&2
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz smoke run failed in: ${failed[*]}" >&2
    exit 1
  fi
  exit 0
fi

CARGO_FUZZ_VERSION=0.13.2
root="$HOME/.cache/kplug/cargo-fuzz-$CARGO_FUZZ_VERSION"
if [ ! -x "$root/bin/cargo-fuzz" ]; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION under $root" >&2
  cargo install --quiet --locked --root "$root" cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
# cargo fuzz COMMAND --fuzz-dir fuzz [ARGS...] (what follows `--` goes to libFuzzer).
fuzz() {
  local command="$1"
  shift
  RUSTC_BOOTSTRAP=1 "$root/bin/cargo-fuzz" "$command" --fuzz-dir fuzz "$@"
}

targets=$(fuzz list)
what="${1:-all}"
seconds="${2:-60}"
case "$what" in
  list) echo "$targets"; exit 0 ;;
  all) ;;
  *)
    grep -qx "$what" <<<"$targets" || { echo "no fuzz target $what; targets: $(echo $targets)" >&2; exit 2; }
    targets="$what"
    ;;
esac

fuzz build
failed=()
for target in $targets; do
  mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
  echo "== $target: $seconds s" >&2
  # -max_len: bodies of a few KiB reach every branch of these parsers.
  if ! fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    2> >(tee "fuzz/artifacts/$target/last-run.log" | grep -E '^(stat::|#[0-9]+ *DONE|==[0-9]+==|SUMMARY|artifact_prefix)' >&2); then
    failed+=("$target")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
