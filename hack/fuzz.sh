#!/usr/bin/env bash
# Fuzzes kplug's parsers of untrusted input with libFuzzer (cargo-fuzz):
# the fuzz targets in fuzz/fuzz_targets, each calling one entry point of
# apiserver/src/fuzzing.rs.
#
#   hack/fuzz.sh [TARGET|all] [SECONDS]   # default: all, 60 s each
#   hack/fuzz.sh smoke [SECONDS]           # every target, 3 s each (hack/test.sh)
#   hack/fuzz.sh list                      # the targets
#
# Each run starts from the committed seeds (fuzz/seeds/TARGET, taken from
# the tests) and the corpus earlier runs grew (fuzz/corpus/TARGET, not
# committed). A crash is written to fuzz/artifacts/TARGET and fails the
# run; make it a test (fuzz/regressions/TARGET/, replayed by `cargo test`
# and by the smoke run) once it is fixed. Runs on the machine's stable
# toolchain (RUSTC_BOOTSTRAP lets cargo-fuzz pass its sanitizer flags);
# cargo-fuzz is installed under ~/.cache/kplug. The first build takes about
# 7 minutes (address sanitizer and coverage, in fuzz/target).
#
# The smoke run is part of the test run: the same binaries, built by the
# test run's own build of the workspace (the fuzz crate is a member; no
# sanitizer, no coverage, no cargo-fuzz; nothing left to build after
# hack/test.sh's `cargo build`), each run by libFuzzer for SECONDS over its
# seeds and past failures (fuzz/regressions/TARGET), then on inputs libFuzzer
# mutates without coverage feedback. It fails, naming the target, if one
# crashes: the targets keep building and running and what they found stays
# fixed. It is not fuzzing (no coverage to steer by).
set -euo pipefail
cd "$(dirname "$0")/.."

# The targets: the binaries of fuzz/Cargo.toml.
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -vx kplug-fuzz)
what="${1:-all}"

if [ "$what" = smoke ]; then
  seconds="${2:-3}"
  # hack/test.sh's build, flag for flag: any other selection of packages or
  # features resolves other features of the dependencies and builds them
  # again.
  cargo build --workspace --all-targets --locked --features kplug-apiserver/fuzzing
  bin="${CARGO_TARGET_DIR:-target}/debug"
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  failed=()
  for target in $targets; do
    inputs=("fuzz/seeds/$target")
    [ -d "fuzz/regressions/$target" ] && inputs+=("fuzz/regressions/$target")
    mkdir -p "fuzz/artifacts/$target" "$scratch/$target"
    log="fuzz/artifacts/$target/smoke.log"
    # The first directory takes what libFuzzer would add to the corpus: a
    # scratch one, so the committed seeds stay as they are.
    if "$bin/$target" -max_total_time="$seconds" -max_len=4096 -len_control=0 -timeout=10 \
      -artifact_prefix="fuzz/artifacts/$target/smoke-" -print_final_stats=1 \
      "$scratch/$target" "${inputs[@]}" >"$log" 2>&1; then
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
      echo "== fuzz smoke $target: ${runs:-?} inputs in $seconds s" >&2
    else
      failed+=("$target")
      echo "== fuzz smoke $target FAILED (log: $log)" >&2
      # Its panic and libFuzzer's report, without the backtrace's frames.
      grep -v -E '^WARNING: Failed to find function|^ *[0-9]+: |^ +at ' "$log" | tail -n 20 >&2
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz smoke run failed: ${failed[*]} (inputs under fuzz/artifacts/TARGET/smoke-*)" >&2
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
# cargo fuzz COMMAND [ARGS...] (what follows `--` goes to libFuzzer). The
# fuzz crate is a member of the root workspace; its instrumented build has
# a target directory of its own, fuzz/target.
fuzz() {
  local command="$1"
  shift
  RUSTC_BOOTSTRAP=1 "$root/bin/cargo-fuzz" "$command" --fuzz-dir fuzz --target-dir fuzz/target "$@"
}

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
