#!/usr/bin/env bash
# Fuzzes kplug's parsers of untrusted input with libFuzzer (cargo-fuzz):
# the fuzz targets in fuzz/fuzz_targets, each calling one entry point of
# apiserver/src/fuzzing.rs.
#
#   hack/fuzz.sh [TARGET|all] [SECONDS]   # default: all, 60 s each
#   hack/fuzz.sh list                      # the targets
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
