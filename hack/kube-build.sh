#!/usr/bin/env bash
# Builds the Kubernetes v1.20.2 components kplug's tests run (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy) from Debian's
# kubernetes source package, and caches them. Prints only the requested
# binary's path on stdout; progress on stderr.
#
#   hack/kube-build.sh                 # build if missing, print kube-apiserver's path
#   hack/kube-build.sh kubelet         # ... kubelet's path
#   hack/kube-build.sh --dir           # ... the folder holding all five
#   KPLUG_CACHE=/some/dir hack/kube-build.sh
#
# Cached binaries: ${KPLUG_CACHE:-$HOME/.cache/kplug}/kubernetes-v1.20.2/bin/,
# keyed on the source version: another version builds into another folder.
# When all five exist this is a fast no-op. Otherwise (about 5-8 minutes on 2
# cores, once) it:
#   - apt-installs golang-go, etcd-server, rsync, make, dpkg-dev, openssl,
#     curl and golang-github-modern-go-reflect2-dev;
#   - adds a deb-src entry for bookworm main (once) and downloads the
#     `kubernetes` source package (1.20.5+really1.20.2 = Kubernetes v1.20.2);
#   - replaces the vendored github.com/modern-go/reflect2 v1.0.1 (crashes
#     under Go >= 1.18) with Debian's 1.0.2;
#   - builds in GOPATH mode (module mode fails on this tree): `make
#     generated_files`, then one `go build` of all five commands (they share
#     most packages, so together is much faster than one by one), with the
#     version stamped as v1.20.2.
# Build trees live under the cache dir and are removed after a successful build
# (KPLUG_KEEP_BUILD=1 keeps them). The source tarball is kept for rebuilds.
set -euo pipefail

K8S_VERSION=v1.20.2
K8S_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56 # upstream tag v1.20.2
CACHE="${KPLUG_CACHE:-$HOME/.cache/kplug}"
OUT_DIR="$CACHE/kubernetes-$K8S_VERSION/bin"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { echo "[kube-build] $*" >&2; }

want="${1:-kube-apiserver}"
case " ${COMPONENTS[*]} --dir " in
  *" $want "*) ;;
  *) log "unknown component '$want': one of ${COMPONENTS[*]}, or --dir"; exit 2 ;;
esac

# print_result: all five are built; print what was asked for.
built() {
  local c
  for c in "${COMPONENTS[@]}"; do [ -x "$OUT_DIR/$c" ] || return 1; done
}
print_result() {
  if [ "$want" = --dir ]; then echo "$OUT_DIR"; else echo "$OUT_DIR/$want"; fi
}

if built; then print_result; exit 0; fi

mkdir -p "$CACHE" "$OUT_DIR"
# One build at a time (parallel test runs may all call this).
exec 9>"$CACHE/kube-build.lock"
if ! flock -n 9; then
  log "another build is running; waiting for $CACHE/kube-build.lock"
  flock 9
fi
if built; then print_result; exit 0; fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    log "not root and no sudo: cannot apt-get install"; fi
fi

BUILD_LOG="$CACHE/kube-build.log"
: >"$BUILD_LOG"
log "build log: $BUILD_LOG"
# run CMD...: runs quietly into the build log; shows its tail on failure.
run() {
  echo "+ $*" >>"$BUILD_LOG"
  if ! "$@" >>"$BUILD_LOG" 2>&1; then
    log "FAILED: $*"
    log "--- last 40 lines of $BUILD_LOG ---"
    tail -n 40 "$BUILD_LOG" >&2
    exit 1
  fi
}

# --- 1. packages --------------------------------------------------------------
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
pkgs=()
command -v go >/dev/null || pkgs+=(golang-go)
command -v etcd >/dev/null || pkgs+=(etcd-server)
command -v rsync >/dev/null || pkgs+=(rsync)
command -v make >/dev/null || pkgs+=(make)
command -v dpkg-source >/dev/null || pkgs+=(dpkg-dev)
command -v openssl >/dev/null || pkgs+=(openssl)
command -v curl >/dev/null || pkgs+=(curl)
[ -d "$REFLECT2_SRC" ] || pkgs+=(golang-github-modern-go-reflect2-dev)
if [ ${#pkgs[@]} -gt 0 ]; then
  log "apt-get install ${pkgs[*]}"
  run $SUDO apt-get update -qq
  run $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
fi
GO_VERSION="$(go env GOVERSION 2>/dev/null || go version)"
log "using $GO_VERSION ($(command -v go))"

# --- 2. source ----------------------------------------------------------------
SRC_DIR="$CACHE/src"
mkdir -p "$SRC_DIR"
orig_tarball() { ls "$SRC_DIR"/kubernetes_*really1.20.2*.orig.tar.* 2>/dev/null | head -n1 || true; }
if [ -z "$(orig_tarball)" ]; then
  has_src() { apt-cache showsrc kubernetes 2>/dev/null | grep -E '^Version: .*really1\.20\.2' >/dev/null; }
  if ! has_src; then
    SRC_LIST=/etc/apt/sources.list.d/kplug-deb-src.sources
    if [ ! -f "$SRC_LIST" ]; then
      log "adding deb-src entry for bookworm main ($SRC_LIST)"
      uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
      [ -n "$uri" ] || uri=http://deb.debian.org/debian
      printf '%s\n' "Types: deb-src" "URIs: $uri" "Suites: bookworm" "Components: main" \
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" | $SUDO tee "$SRC_LIST" >/dev/null
    fi
    log "apt-get update (for the deb-src index)"
    run $SUDO apt-get update -qq
    has_src || { log "apt-cache showsrc kubernetes finds no 1.20.2 source package"; exit 1; }
  fi
  log "downloading the Debian kubernetes source package"
  # apt verifies the files against the signed Sources index.
  (cd "$SRC_DIR" && run apt-get source --download-only kubernetes)
  [ -n "$(orig_tarball)" ] || { log "no kubernetes_*really1.20.2*.orig.tar.* in $SRC_DIR:"; ls -l "$SRC_DIR" >&2; exit 1; }
fi
TARBALL="$(orig_tarball)"
log "source: $TARBALL"

# --- 3. GOPATH tree -----------------------------------------------------------
BUILD_DIR="$CACHE/build-kubernetes-$K8S_VERSION"
GOPATH_DIR="$BUILD_DIR/gopath"
K8S_DIR="$GOPATH_DIR/src/k8s.io/kubernetes"
export GOCACHE="$BUILD_DIR/go-build-cache"
export GOPATH="$GOPATH_DIR"
export GO111MODULE=off
export CGO_ENABLED=0
export GOFLAGS=""
export GOTOOLCHAIN=local
unset GOBIN GOROOT 2>/dev/null || true

if [ ! -f "$K8S_DIR/.kplug-unpacked" ]; then
  log "unpacking into $K8S_DIR"
  rm -rf "$K8S_DIR"
  mkdir -p "$K8S_DIR"
  run tar -xf "$TARBALL" -C "$K8S_DIR" --strip-components=1
  [ -f "$K8S_DIR/cmd/kube-apiserver/apiserver.go" ] || { log "unexpected tarball layout"; ls "$K8S_DIR" >&2; exit 1; }

  log "replacing vendored modern-go/reflect2 with Debian's $(basename "$(readlink -f "$REFLECT2_SRC")") copy"
  rm -rf "$K8S_DIR/vendor/github.com/modern-go/reflect2"
  mkdir -p "$K8S_DIR/vendor/github.com/modern-go/reflect2"
  # Follow symlinks: Debian's gocode tree may link files elsewhere.
  cp -rL "$REFLECT2_SRC/." "$K8S_DIR/vendor/github.com/modern-go/reflect2/"
  rm -f "$K8S_DIR/vendor/github.com/modern-go/reflect2/go.mod" "$K8S_DIR/vendor/github.com/modern-go/reflect2/go.sum"
  touch "$K8S_DIR/.kplug-unpacked"
fi

# --- 4. build -----------------------------------------------------------------
cd "$K8S_DIR"
start=$(date +%s)
if [ ! -f "$K8S_DIR/.kplug-generated" ]; then
  log "make generated_files (GOPATH mode; a few minutes)"
  run make generated_files
  touch "$K8S_DIR/.kplug-generated"
fi
log "go build ${COMPONENTS[*]} (a few minutes)"
# Same stamps as upstream's hack/lib/version.sh. Both packages matter: the
# --version flag reads component-base's, while GET /version is answered by the
# aggregator, which reads client-go's. GOPATH mode puts vendored packages
# under k8s.io/kubernetes/vendor/.
ldflags="-s -w"
for VPKG in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  ldflags+=" -X $VPKG.gitVersion=$K8S_VERSION"
  ldflags+=" -X $VPKG.gitMajor=1 -X $VPKG.gitMinor=20"
  ldflags+=" -X $VPKG.gitCommit=$K8S_GIT_COMMIT"
  ldflags+=" -X $VPKG.gitTreeState=clean"
  ldflags+=" -X $VPKG.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
mkdir -p "$BUILD_DIR/bin"
packages=()
for c in "${COMPONENTS[@]}"; do packages+=("./cmd/$c"); done
# `go build -o DIR` with several main packages writes one binary per package.
run go build -o "$BUILD_DIR/bin/" -ldflags "$ldflags" "${packages[@]}"
log "built in $(( $(date +%s) - start ))s"

for c in "${COMPONENTS[@]}"; do
  got="$("$BUILD_DIR/bin/$c" --version 2>&1 || true)"
  case "$got" in
    *"$K8S_VERSION"*) log "$c: $got" ;;
    *) log "$c: unexpected version output: $got"; exit 1 ;;
  esac
  mv -f "$BUILD_DIR/bin/$c" "$OUT_DIR/$c.tmp.$$"
  mv -f "$OUT_DIR/$c.tmp.$$" "$OUT_DIR/$c"
done

cd /
if [ "${KPLUG_KEEP_BUILD:-0}" != 1 ]; then
  log "removing build tree $BUILD_DIR"
  chmod -R u+w "$BUILD_DIR" 2>/dev/null || true  # Go's module cache is read-only
  rm -rf "$BUILD_DIR"
fi
print_result
