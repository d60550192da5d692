#!/usr/bin/env bash
# kplug's book (docs/, mdBook).
#   hack/docs.sh install     mdBook, and Debian's Prometheus (to run the monitoring guide's
#                            queries), into ~/.cache/kplug/tools (hack/setup.sh runs this)
#   hack/docs.sh build       the book into docs/book/ (open docs/book/index.html)
#   hack/docs.sh reference   docs/src/reference/ regenerated from the code (builds the workspace first)
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned: the book's theme and its link check depend on the HTML it writes.
MDBOOK_VERSION=0.5.4
tools=${KPLUG_TOOLS:-$HOME/.cache/kplug/tools}
mdbook=$tools/bin/mdbook

install_mdbook() {
  if ! "$mdbook" --version 2>/dev/null | grep -qx "mdbook v$MDBOOK_VERSION"; then
    echo "== installing mdbook $MDBOOK_VERSION into $tools (about 2 minutes, once)" >&2
    # Without default features: no `serve`/`watch` (a web server and file
    # watching), half the build; `build` is all the suite needs.
    cargo install --locked --quiet --no-default-features --root "$tools" --version "$MDBOOK_VERSION" mdbook
  fi
}

# The package's files only, unpacked: installing it would enable a Prometheus
# service on every machine the suite runs on.
install_prometheus() {
  [ -x "$tools/prometheus/usr/bin/prometheus" ] && return
  echo "== installing Debian's prometheus into $tools/prometheus (its files, no service)" >&2
  local downloads
  downloads=$(mktemp -d)
  (cd "$downloads" && { apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; })
  dpkg-deb -x "$downloads"/prometheus_*.deb "$tools/prometheus"
  rm -rf "$downloads"
}

case "${1:-}" in
  install)
    install_mdbook
    install_prometheus
    ;;
  build)
    install_mdbook
    "$mdbook" build docs
    echo "the book: docs/book/index.html" >&2
    ;;
  reference)
    cargo build --workspace --quiet
    "${KPLUG_VENV:-$HOME/.cache/kplug/venv}/bin/python" hack/docs/reference.py write
    ;;
  *)
    sed -n '2,5s/^# //p' "$0" >&2
    exit 2
    ;;
esac
