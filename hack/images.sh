#!/usr/bin/env bash
# Builds kplug's container images from the Dockerfiles we ship, with buildah
# and no image registry: the base images are made here from Debian packages.
#
#   hack/images.sh bases [--refresh]   # the local base images
#   hack/images.sh build [NAME...]     # the shipped images (default: all)
#   hack/images.sh load [NAME...]      # import them into containerd (k8s.io)
#   hack/images.sh check [NAME...]     # run each with --help, no network; its uid
#   hack/images.sh sizes               # each image's size, raw and gzipped
#   hack/images.sh list                # NAME IMAGE DOCKERFILE, one per line
#   hack/images.sh id NAME             # the built image's ID (sha256:...), as
#                                      # a pod's status.containerStatuses[].imageID
#   hack/images.sh verify REF...       # fails unless each runs as 65532:65532
#
# NAME is the image's repository name: kplug-apiserver, kplug-operator,
# database-table-mariadb-plugin, database-table-postgresql-plugin, the hello
# plugin hello-plugin (the in-cluster benches'), the website plugin
# website-plugin, and the walkthrough's throwaway databases
# walkthrough-postgres, walkthrough-mariadb.
# Each is tagged exactly as the manifests (deploy/, examples/*/deploy/)
# reference it, e.g.
# ghcr.io/kplug/kplug-apiserver:0.1.0, kplug.local/walkthrough-postgres:15.
#
# bases: makes, with debootstrap (Debian bookworm from this machine's apt
# mirror, else deb.debian.org) and buildah:
#   localhost/kplug-base/debian      bookworm minbase, slim (no docs/man/locales)
#   localhost/kplug-base/rust-build  for rust:1.89-bookworm: gcc, libc6-dev,
#       make, and this machine's own Rust toolchain (`rustc --print sysroot`:
#       rustc, cargo, rustdoc, rust-std), cargo at /usr/local/cargo/bin
#   localhost/kplug-base/cc-nonroot  for gcr.io/distroless/cc-debian12:nonroot:
#       the files of libc6, libgcc-s1, libgomp1, libstdc++6, libssl3,
#       ca-certificates (the bundle), tzdata, netbase, base-files; user and
#       group nonroot (65532); no shell, no package manager
#   localhost/kplug-base/python      for python:3.12-slim-bookworm: Debian's
#       python3 (3.11) with venv and pip, and `python`
# Each is remade only when its recipe, package list, mirror or (rust-build)
# toolchain changed; --refresh (or KPLUG_IMAGES_REFRESH=1) remakes them all,
# e.g. for Debian's security updates.
# build: makes the bases if needed, then `buildah bud`s each Dockerfile with
# the bases as build arguments (BUILD_IMAGE and RUNTIME_IMAGE, PYTHON_IMAGE,
# DEBIAN_IMAGE).
# RUN steps have the host's network (cargo fetches from crates.io, pip from
# PyPI) and see this machine's CA bundle (KPLUG_BUILD_CA_BUNDLE, default
# /etc/ssl/certs/ca-certificates.crt; empty: none), which is never committed.
# An image is rebuilt only when the files of its build context (after its
# .dockerignore), its Dockerfile or a base changed. Each image must run as
# uid:gid 65532:65532 (checked). Writes a docker-archive per image that
# `ctr images import` accepts: $CACHE/archives/NAME.tar.
# load: imports the archives into containerd's namespace k8s.io at
# $CONTAINERD_ADDRESS (default /run/containerd/containerd.sock), unpacked for
# the snapshotter $CONTAINERD_SNAPSHOTTER (default overlayfs); skips an image
# containerd already holds.
# check: in a container with no network, runs the image's entrypoint with
# --help, and a static probe that prints the uid and gid it runs as; fails
# unless both succeed and the uid:gid is 65532:65532.
# verify: the check `build` makes of each image's config (User must be the
# numeric 65532:65532), for any image in buildah's storage.
#
# CACHE is ${KPLUG_CACHE:-$HOME/.cache/kplug}/images: apt's package lists
# and .debs, the archives, build logs (logs/NAME.log) and what each image was
# built from (state/). buildah keeps the images, and the cargo/pip caches of
# the Dockerfiles' cache mounts, in its own storage. Needs root, buildah
# (>= 1.24), debootstrap, python3; installs buildah and debootstrap with apt
# when missing.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HACK_DIR/.." && pwd)"
CACHE="${KPLUG_CACHE:-$HOME/.cache/kplug}/images"

SUITE=bookworm
BASE=localhost/kplug-base
# What the Dockerfiles need beyond minbase (rust:1.89-bookworm has more).
# gcc: the cc crate (ring, jemalloc); make: jemalloc's build.
RUST_BUILD_PACKAGES=(ca-certificates gcc libc6-dev make)
# distroless cc-debian12 = static (base-files, netbase, tzdata, CA bundle)
# + base (libc6, libssl3) + cc (libgcc-s1, libgomp1, libstdc++6).
CC_PACKAGES=(base-files netbase tzdata ca-certificates libc6 libssl3 libgcc-s1 libgomp1 libstdc++6)
# As python:3.12-slim-bookworm installs (ca-certificates, netbase, tzdata).
PYTHON_PACKAGES=(ca-certificates netbase tzdata python3 python3-venv python-is-python3)
NONROOT_UID=65532

# The shipped images: NAME, Dockerfile, manifest whose `image:` names it.
IMAGES=(
  "kplug-apiserver deploy/Dockerfile deploy/deployment.yaml"
  "kplug-operator deploy/operator.Dockerfile examples/database-table/deploy/operator.yaml"
  "database-table-mariadb-plugin examples/database-table/deploy/mariadb-plugin.Dockerfile examples/database-table/deploy/mariadb-plugin.yaml"
  "database-table-postgresql-plugin examples/database-table/deploy/postgresql-plugin.Dockerfile examples/database-table/deploy/postgresql-plugin.yaml"
  "hello-plugin examples/hello-rust/Dockerfile examples/hello-rust/deploy/hello-plugin.yaml"
  "website-plugin examples/website/Dockerfile examples/website/deploy/plugin.yaml"
  # The walkthrough's throwaway databases (hack/walkthrough.sh --cluster).
  "walkthrough-postgres examples/database-table/deploy/databases/postgres.Dockerfile examples/database-table/deploy/databases/postgres.yaml"
  "walkthrough-mariadb examples/database-table/deploy/databases/mariadb.Dockerfile examples/database-table/deploy/databases/mariadb.yaml"
)

log() { echo "[images] $*" >&2; }
die() { echo "[images] error: $*" >&2; exit 1; }

usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

# --- housekeeping -------------------------------------------------------------

CONTAINERS=()
TMPDIRS=()
cleanup() {
  local c d
  for c in "${CONTAINERS[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
  for d in "${TMPDIRS[@]}"; do rm -rf "$d"; done
}
trap cleanup EXIT

# new_container IMAGE: CTR becomes a new buildah working container of IMAGE,
# removed at exit. (Not in $(...): the record would stay in the subshell.)
new_container() {
  CTR="$(buildah from --pull=never --quiet "$1")" || die "buildah from $1 failed"
  CONTAINERS+=("$CTR")
}

drop_container() {
  buildah rm "$1" >/dev/null
  local keep=() c
  for c in "${CONTAINERS[@]}"; do [ "$c" = "$1" ] || keep+=("$c"); done
  CONTAINERS=("${keep[@]+"${keep[@]}"}")
}

# new_tmpdir NAME: TMP becomes a new folder, removed at exit.
new_tmpdir() {
  mkdir -p "$CACHE/tmp"
  TMP="$(mktemp -d "$CACHE/tmp/$1.XXXXXX")"
  TMPDIRS+=("$TMP")
}

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (buildah with its system storage, debootstrap)"
}

ensure_tools() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v python3 >/dev/null || missing+=(python3)
  if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || die "missing: ${missing[*]}"
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# One hack/images.sh at a time: they share buildah's tags and the cache.
lock() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/lock"
  if ! flock -n 9; then
    log "waiting for another hack/images.sh (lock $CACHE/lock)"
    flock 9
  fi
}

sha() { sha256sum | cut -d' ' -f1; }

# image_id REF: the image's ID, or nothing when buildah has no such image.
image_id() {
  buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null || true
}

# stamp_get NAME FIELD / stamp_put NAME key=value...: what NAME was built from.
stamp_get() {
  [ -f "$CACHE/state/$1" ] || return 0
  sed -n "s/^$2=//p" "$CACHE/state/$1"
}

stamp_put() {
  local name="$1"; shift
  mkdir -p "$CACHE/state"
  printf '%s\n' "$@" >"$CACHE/state/$name.new"
  mv "$CACHE/state/$name.new" "$CACHE/state/$name"
}

# up_to_date NAME REF KEY: NAME was built from KEY and REF is still that image.
up_to_date() {
  local id
  [ "$(stamp_get "$1" key)" = "$3" ] || return 1
  id="$(image_id "$2")"
  [ -n "$id" ] && [ "$id" = "$(stamp_get "$1" id)" ]
}

# retire ID: an image a rebuild replaced; sweep removes it once nothing
# names it and no other image is built on it.
retire() {
  [ -n "$1" ] || return 0
  mkdir -p "$CACHE/state"
  echo "${1#sha256:}" >>"$CACHE/state/replaced"
}

sweep() {
  local f="$CACHE/state/replaced" id dangling left
  [ -s "$f" ] || return 0
  # Three rounds: an image becomes dangling once the images on it are gone.
  for _ in 1 2 3; do
    dangling=" $(buildah images -q --no-trunc --filter dangling=true | sed 's/^sha256://' | tr '\n' ' ') "
    while read -r id; do
      if [[ "$dangling" == *" $id "* ]]; then buildah rmi "$id" >/dev/null 2>&1 || true; fi
    done <"$f"
  done
  left=""
  while read -r id; do
    [ -z "$(image_id "$id")" ] || left+="$id"$'\n'
  done < <(sort -u "$f")
  printf '%s' "$left" >"$f"
}

# --- Debian -------------------------------------------------------------------

# mirrors: "MIRROR SECURITY_MIRROR" for bookworm, from this machine's apt
# sources (deb822 or one-line), else Debian's defaults. KPLUG_DEBIAN_MIRROR
# and KPLUG_DEBIAN_SECURITY_MIRROR override.
mirrors() {
  local main="" security="" f m s
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822 stanzas: the first URI of a stanza whose Suites name the suite.
    read -r m s < <(awk -v suite="$SUITE" '
      function flush() {
        if (uri != "") {
          if (suites ~ ("(^| )" suite "( |$)") && main == "") main = uri
          if (suites ~ ("(^| )" suite "-security( |$)") && sec == "") sec = uri
        }
        uri = ""; suites = ""
      }
      /^[ \t]*$/ { flush(); next }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
      END { flush(); print (main == "" ? "-" : main), (sec == "" ? "-" : sec) }
    ' "$f")
    [ -z "$main" ] && [ "$m" != - ] && main="$m"
    [ -z "$security" ] && [ "$s" != - ] && security="$s"
  done
  if [ -z "$main" ] && [ -f /etc/apt/sources.list ]; then
    main="$(awk -v suite="$SUITE" '$1 == "deb" && $3 == suite {print $2; exit}' /etc/apt/sources.list)"
    security="$(awk -v suite="$SUITE-security" '$1 == "deb" && $3 == suite {print $2; exit}' /etc/apt/sources.list)"
  fi
  main="${KPLUG_DEBIAN_MIRROR:-${main:-http://deb.debian.org/debian}}"
  security="${KPLUG_DEBIAN_SECURITY_MIRROR:-${security:-http://deb.debian.org/debian-security}}"
  echo "${main%/} ${security%/}"
}

# apt_run CONTAINER SCRIPT [HOST:PATH...]: runs SCRIPT (sh, where `apt` is
# apt-get, quiet) in CONTAINER with the host's network, and apt's lists and
# .debs in the cache (bind mounts, so they never end up in an image), and
# the other bind mounts given.
apt_run() {
  local c="$1" script="$2" v volumes=(); shift 2
  mkdir -p "$CACHE/apt/lists/partial" "$CACHE/apt/archives/partial"
  for v in "$CACHE/apt/lists:/var/lib/apt/lists" "$CACHE/apt/archives:/var/cache/apt/archives" "$@"; do
    volumes+=(--volume "$v")
  done
  buildah run --network host "${volumes[@]}" "$c" -- sh -euc "export DEBIAN_FRONTEND=noninteractive
      apt() { apt-get -q -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0 \"\$@\"; }
      $script"
}

# Like Debian's slim images: no documentation, manuals or translations
# (copyright files stay).
DPKG_EXCLUDES='path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*'

make_debian() {
  local ref="$1" mirror="$2" security="$3" tmp rootfs c
  new_tmpdir debian; tmp="$TMP"
  rootfs="$tmp/rootfs"
  mkdir -p "$CACHE/apt/archives/partial"
  log "debootstrap $SUITE (minbase) from $mirror"
  if ! debootstrap --variant=minbase --cache-dir="$CACHE/apt/archives" \
    "$SUITE" "$rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
    tail -n 30 "$tmp/debootstrap.log" "$rootfs/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    die "debootstrap failed (above: the end of its log)"
  fi
  # Slim it, and leave nothing of this machine or of the bootstrap.
  printf '%s\n' "$DPKG_EXCLUDES" >"$rootfs/etc/dpkg/dpkg.cfg.d/excludes"
  find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/*
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/bootstrap.log "$rootfs"/var/log/dpkg.log \
    "$rootfs"/var/log/alternatives.log "$rootfs"/var/log/apt/* \
    "$rootfs"/etc/hostname "$rootfs"/etc/resolv.conf "$rootfs"/etc/machine-id
  rm -f "$rootfs/etc/apt/sources.list"
  # As Debian's container images: apt keeps no package caches in the image.
  printf 'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n' >"$rootfs/etc/apt/apt.conf.d/docker-clean"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  new_container scratch; c="$CTR"
  cp -a "$rootfs/." "$(buildah mount "$c")/"
  buildah umount "$c" >/dev/null
  log "apt-get upgrade ($SUITE-updates, $SUITE-security)"
  apt_run "$c" 'apt update; apt upgrade -y; rm -f /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/apt/*.bin' \
    >"$tmp/apt.log" 2>&1 || { tail -n 30 "$tmp/apt.log" >&2; die "apt-get upgrade failed in $ref"; }
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --created-by "hack/images.sh: debootstrap --variant=minbase $SUITE" "$c"
  buildah commit --quiet --rm "$c" "$ref" >/dev/null
  drop_container_record "$c"
}

# drop_container_record C: C was removed by `commit --rm`.
drop_container_record() {
  local keep=() x
  for x in "${CONTAINERS[@]}"; do [ "$x" = "$1" ] || keep+=("$x"); done
  CONTAINERS=("${keep[@]+"${keep[@]}"}")
}

# install_packages DEBIAN_REF LOG PACKAGE...: CTR becomes a working
# container of DEBIAN_REF with PACKAGEs installed (without recommends).
install_packages() {
  local from="$1" logf="$2" c; shift 2
  new_container "$from"; c="$CTR"
  apt_run "$c" "apt update; apt install -y --no-install-recommends $*; rm -f /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/debconf/*-old /var/cache/apt/*.bin" \
    >"$logf" 2>&1 || { tail -n 30 "$logf" >&2; die "apt-get install $* failed"; }
}

# --- Rust ---------------------------------------------------------------------

# The active toolchain: rustup's default (stable here) or any rustc on PATH;
# KPLUG_RUST_SYSROOT overrides.
rust_sysroot() {
  local s="${KPLUG_RUST_SYSROOT:-}"
  [ -n "$s" ] || s="$(cd / && rustc --print sysroot 2>/dev/null)" ||
    die "no Rust toolchain on this machine (rustc --print sysroot failed): the rust-build base copies it"
  readlink -f "$s"
}

rust_version() {
  "$1/bin/rustc" -vV && "$1/bin/cargo" -V
}

make_rust_build() {
  local ref="$1" debian="$2" sysroot="$3" tmp c mnt tc release
  new_tmpdir rust-build; tmp="$TMP"
  log "rust-build: ${RUST_BUILD_PACKAGES[*]} and the toolchain in $sysroot"
  install_packages "$debian" "$tmp/apt.log" "${RUST_BUILD_PACKAGES[@]}"; c="$CTR"
  tc="$(basename "$sysroot")"
  release="$("$sysroot/bin/rustc" -vV | sed -n 's/^release: //p')"
  mnt="$(buildah mount "$c")"
  # As rust:*-bookworm: RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo
  # (world-writable) with its bin on PATH. The minimal profile: rustc, cargo,
  # rustdoc and the standard library (lib/ holds rustc's libraries, rust-std
  # and the self-contained linker); no docs, clippy or rustfmt.
  mkdir -p "$mnt/usr/local/rustup/toolchains/$tc/bin" "$mnt/usr/local/cargo/bin"
  cp -a "$sysroot/lib" "$mnt/usr/local/rustup/toolchains/$tc/"
  cp -a "$sysroot/bin/rustc" "$sysroot/bin/cargo" "$sysroot/bin/rustdoc" "$mnt/usr/local/rustup/toolchains/$tc/bin/"
  for b in rustc cargo rustdoc; do
    ln -s "../../rustup/toolchains/$tc/bin/$b" "$mnt/usr/local/cargo/bin/$b"
  done
  chmod -R a+w "$mnt/usr/local/cargo"
  buildah umount "$c" >/dev/null
  buildah config \
    --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env RUST_VERSION="$release" --cmd bash \
    --created-by "hack/images.sh: ${RUST_BUILD_PACKAGES[*]}, Rust $release ($tc) from this machine" "$c"
  # A program must compile and link (cc as linker, the self-contained lld).
  buildah run --network none "$c" -- sh -euc '
    cd /tmp && printf "fn main() { println!(\"ok\"); }\n" >t.rs && rustc -O t.rs -o t && ./t && rm -f t t.rs
    cargo --version && rustc --version' >"$tmp/check.log" 2>&1 ||
    { cat "$tmp/check.log" >&2; die "the Rust toolchain does not work in $ref"; }
  buildah commit --quiet --rm "$c" "$ref" >/dev/null
  drop_container_record "$c"
}

# --- distroless-like runtime ----------------------------------------------------

make_cc_nonroot() {
  local ref="$1" debian="$2" tmp c root deb pkg
  new_tmpdir cc-nonroot; tmp="$TMP"
  mkdir -p "$tmp/debs" "$tmp/root"
  root="$tmp/root"
  log "cc-nonroot: the files of ${CC_PACKAGES[*]}"
  new_container "$debian"; c="$CTR"
  apt_run "$c" "apt update; cd /debs; apt download ${CC_PACKAGES[*]}" "$tmp/debs:/debs" \
    >"$tmp/apt.log" 2>&1 || { tail -n 30 "$tmp/apt.log" >&2; die "apt-get download ${CC_PACKAGES[*]} failed"; }
  drop_container "$c"
  # The packages' files, not their maintainer scripts (no shell to run them).
  # As distroless: each package's control data under /var/lib/dpkg/status.d
  # for scanners, no docs but the copyright files.
  mkdir -p "$root/var/lib/dpkg/status.d"
  for deb in "$tmp"/debs/*.deb; do
    pkg="$(dpkg-deb -f "$deb" Package)"
    dpkg-deb -x "$deb" "$root"
    { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } >"$root/var/lib/dpkg/status.d/$pkg"
  done
  for pkg in "${CC_PACKAGES[@]}"; do
    [ -f "$root/var/lib/dpkg/status.d/$pkg" ] || die "package $pkg was not downloaded"
  done
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/{man,info,lintian,locale} "$root"/usr/share/doc-base "$root"/etc/init.d \
    "$root"/usr/sbin "$root"/etc/profile.d "$root"/etc/update-motd.d "$root"/etc/cron.daily
  # ca-certificates' postinst would build the bundle: every Mozilla CA.
  mkdir -p "$root/etc/ssl/certs"
  find "$root/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort |
    while read -r crt; do cat "$crt"; done >"$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root/usr/share/ca-certificates"
  [ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || die "empty CA bundle"
  # tzdata's postinst would make these.
  ln -sf /usr/share/zoneinfo/Etc/UTC "$root/etc/localtime"
  echo Etc/UTC >"$root/etc/timezone"
  # Users and groups of distroless's :nonroot images.
  cat >"$root/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:$NONROOT_UID:$NONROOT_UID:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$root/etc/group" <<EOF
root:x:0:
tty:x:5:
staff:x:50:
nogroup:x:65534:
nonroot:x:$NONROOT_UID:
EOF
  printf 'hosts: files dns\nnetworks: files\npasswd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"
  mkdir -p "$root/tmp" "$root/root" "$root/home/nonroot"
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/root" "$root/home/nonroot"
  chown "$NONROOT_UID:$NONROOT_UID" "$root/home/nonroot"
  # No shell, no package manager: nothing of the kind was extracted.
  for f in bin/sh usr/bin/sh bin/bash usr/bin/dpkg usr/bin/apt; do
    [ ! -e "$root/$f" ] || die "cc-nonroot would contain /$f"
  done
  new_container scratch; c="$CTR"
  cp -a "$root/." "$(buildah mount "$c")/"
  buildah umount "$c" >/dev/null
  buildah config --user "$NONROOT_UID" --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --created-by "hack/images.sh: files of ${CC_PACKAGES[*]}" "$c"
  buildah commit --quiet --rm "$c" "$ref" >/dev/null
  drop_container_record "$c"
}

# --- Python -------------------------------------------------------------------

make_python() {
  local ref="$1" debian="$2" tmp c
  new_tmpdir python; tmp="$TMP"
  log "python: ${PYTHON_PACKAGES[*]}"
  install_packages "$debian" "$tmp/apt.log" "${PYTHON_PACKAGES[@]}"; c="$CTR"
  buildah config --env LANG=C.UTF-8 --cmd python3 \
    --created-by "hack/images.sh: ${PYTHON_PACKAGES[*]}" "$c"
  buildah run --network none "$c" -- sh -euc '
    python -m venv /tmp/venv && /tmp/venv/bin/pip --version && rm -rf /tmp/venv' >"$tmp/check.log" 2>&1 ||
    { cat "$tmp/check.log" >&2; die "python -m venv does not work in $ref"; }
  buildah commit --quiet --rm "$c" "$ref" >/dev/null
  drop_container_record "$c"
}

# --- bases --------------------------------------------------------------------

# ensure_base NAME KEY MAKER ARGS...: (re)makes $BASE/NAME with MAKER unless
# it was made from KEY.
ensure_base() {
  local name="$1" key="$2" maker="$3" ref="$BASE/$1" old start; shift 3
  if [ "${KPLUG_IMAGES_REFRESH:-0}" != 1 ] && up_to_date "base-$name" "$ref" "$key"; then
    return 0
  fi
  old="$(image_id "$ref")"
  start=$SECONDS
  "$maker" "$ref" "$@"
  stamp_put "base-$name" "key=$key" "id=$(image_id "$ref")"
  log "$ref: made in $((SECONDS - start)) s"
  [ "$old" = "$(image_id "$ref")" ] || retire "$old"
}

bases() {
  need_root
  ensure_tools
  local mirror security debian_key rust_key sysroot debian_id
  read -r mirror security < <(mirrors)
  debian_key="$({ echo "$SUITE $mirror $security"; echo "$DPKG_EXCLUDES"; declare -f make_debian apt_run; } | sha)"
  ensure_base debian "$debian_key" make_debian "$mirror" "$security"
  debian_id="$(image_id "$BASE/debian")"

  sysroot="$(rust_sysroot)"
  rust_key="$({ echo "$debian_id ${RUST_BUILD_PACKAGES[*]} $(basename "$sysroot")"; rust_version "$sysroot"; declare -f make_rust_build install_packages; } | sha)"
  ensure_base rust-build "$rust_key" make_rust_build "$BASE/debian" "$sysroot"
  ensure_base cc-nonroot "$({ echo "$debian_id ${CC_PACKAGES[*]} $NONROOT_UID"; declare -f make_cc_nonroot; } | sha)" \
    make_cc_nonroot "$BASE/debian"
  ensure_base python "$({ echo "$debian_id ${PYTHON_PACKAGES[*]}"; declare -f make_python install_packages; } | sha)" \
    make_python "$BASE/debian"
  KPLUG_IMAGES_REFRESH=0
  sweep
}

# --- the shipped images -------------------------------------------------------

# Bumped when the way images are built changes (rebuilds them all).
BUILD_RECIPE=1

# Each build argument a Dockerfile may declare, and the base it gets here.
declare -A BASE_OF_ARG=([BUILD_IMAGE]=rust-build [RUNTIME_IMAGE]=cc-nonroot [PYTHON_IMAGE]=python [DEBIAN_IMAGE]=debian)

# image_field NAME INDEX: field INDEX (1: Dockerfile, 2: manifest) of NAME.
image_field() {
  local entry f
  for entry in "${IMAGES[@]}"; do
    read -r -a f <<<"$entry"
    [ "${f[0]}" = "$1" ] && { echo "${f[$2]}"; return 0; }
  done
  die "unknown image $1 (known: $(image_names | tr '\n' ' '))"
}

image_names() {
  local entry
  for entry in "${IMAGES[@]}"; do echo "${entry%% *}"; done
}

# image_ref NAME: the reference the manifests run NAME as, after the
# kustomization's `images:` (newName/newTag); they must agree.
image_ref() {
  local name="$1" manifest ref repo kust override
  manifest="$ROOT/$(image_field "$name" 2)"
  ref="$(awk '$1 == "image:" || $2 == "image:" {print $NF}' "$manifest" | grep -E "/$name:" | head -n 1)"
  [ -n "$ref" ] || die "no image */$name:TAG in $manifest"
  repo="${ref%:*}"
  kust="$(dirname "$manifest")/kustomization.yaml"
  if [ -f "$kust" ]; then
    override="$(awk -v repo="$repo" '
      $1 == "-" && $2 == "name:" { inside = ($3 == repo); next }
      $1 == "-" { inside = 0 }
      inside && $1 == "newName:" { name = $2 }
      inside && $1 == "newTag:" { tag = $2 }
      END { print (name == "" ? repo : name) ":" tag }' "$kust")"
    if [ "${override#*:}" != "" ] && [ "$override" != "$ref" ]; then
      die "$manifest runs $ref but $kust makes it $override: make them agree"
    fi
  fi
  echo "$ref"
}

# context_hash CONTEXT IGNOREFILE: a hash of the files a build sends (the
# context minus what IGNOREFILE excludes, with Docker's rules), by path,
# executable bit and content.
context_hash() {
  python3 - "$1" "$2" <<'PY'
import hashlib, os, re, stat, sys

context, ignorefile = sys.argv[1], sys.argv[2]
patterns = []
if ignorefile:
    for line in open(ignorefile, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = os.path.normpath(line[1:] if negate else line).lstrip("/")
        patterns.append((negate, pat))

def regex(pat):
    out, i = "", 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out += "(?:.*/)?"; i += 3; continue
        if pat.startswith("**", i):
            out += ".*"; i += 2; continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            j = pat.find("]", i)
            if j < 0:
                out += re.escape(c)
            else:
                out += pat[i:j + 1].replace("[!", "[^"); i = j
        elif c == "\\" and i + 1 < len(pat):
            i += 1; out += re.escape(pat[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")

compiled = [(neg, pat, regex(pat)) for neg, pat in patterns]

def excluded(rel):
    # Docker: the last pattern that matches the path or one of its parents wins.
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for neg, _, rx in compiled:
        if any(rx.match(p) for p in prefixes):
            result = not neg
    return result

def may_reinclude(rel):
    for neg, pat, _ in compiled:
        if not neg:
            continue
        literal = re.split(r"[*?\[\\]", pat, maxsplit=1)[0]
        if literal == "" or literal.startswith(rel + "/") or (rel + "/").startswith(literal):
            return True
    return False

h = hashlib.sha256()
count = 0
for dirpath, dirnames, filenames in os.walk(context):
    reldir = os.path.relpath(dirpath, context)
    reldir = "" if reldir == "." else reldir + "/"
    dirnames[:] = sorted(d for d in dirnames
                         if not (excluded(reldir + d) and not may_reinclude(reldir + d)))
    for f in sorted(filenames):
        rel = reldir + f
        if excluded(rel):
            continue
        full = os.path.join(dirpath, f)
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            data = b"link:" + os.readlink(full).encode()
        else:
            with open(full, "rb") as fh:
                data = fh.read()
        h.update(b"%s\0%o\0%s\0" % (rel.encode(), st.st_mode & 0o111, hashlib.sha256(data).hexdigest().encode()))
        count += 1
print(h.hexdigest(), count)
PY
}

# check_user NAME USER: USER (the image config's) is uid:gid 65532:65532.
check_user() {
  local name="$1" user="$2"
  if [[ ! "$user" =~ ^([0-9]+):([0-9]+)$ ]]; then
    die "$name runs as user '${user:-<unset: root>}'; it must be numeric uid:gid $NONROOT_UID:$NONROOT_UID (USER in its Dockerfile)"
  fi
  if [ "${BASH_REMATCH[1]}" = 0 ] || [ "${BASH_REMATCH[2]}" = 0 ] || [ "${BASH_REMATCH[1]}" != "$NONROOT_UID" ]; then
    die "$name runs as $user; it must run as $NONROOT_UID:$NONROOT_UID (non-root)"
  fi
}

# archive_info ARCHIVE: "CONFIG_DIGEST RAW_BYTES GZIPPED_BYTES" of a
# docker-archive: its layers' sizes as stored and gzip -6 compressed.
archive_info() {
  python3 - "$1" <<'PY'
import json, sys, tarfile, zlib
with tarfile.open(sys.argv[1]) as tar:
    manifest = json.load(tar.extractfile("manifest.json"))[0]
    raw = gz = 0
    for layer in manifest["Layers"]:
        f = tar.extractfile(layer)
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        while chunk := f.read(1 << 20):
            raw += len(chunk)
            gz += len(z.compress(chunk))
        gz += len(z.flush())
    config = manifest["Config"]
    digest = config if config.startswith("sha256:") else "sha256:" + config.rsplit("/", 1)[-1].removesuffix(".json")
    print(digest, raw, gz)
PY
}

build_one() {
  local name="$1" df ref ign="" arg base_ref base_id args=() ca=() key ctx old id tmp logf user start archive info
  df="$(image_field "$name" 1)"
  ref="$(image_ref "$name")"
  [ -f "$ROOT/$df.dockerignore" ] && ign="$ROOT/$df.dockerignore"
  [ -z "$ign" ] && [ -f "$ROOT/.dockerignore" ] && ign="$ROOT/.dockerignore"
  while read -r arg; do
    [ -n "${BASE_OF_ARG[$arg]:-}" ] || continue
    base_ref="$BASE/${BASE_OF_ARG[$arg]}"
    base_id="$(image_id "$base_ref")"
    [ -n "$base_id" ] || die "base $base_ref is missing (hack/images.sh bases)"
    args+=(--build-arg "$arg=$base_ref")
    key+="$arg=$base_ref@$base_id "
  done < <(sed -n 's/^ARG \([A-Z_]*\)=.*/\1/p' "$ROOT/$df")
  [ ${#args[@]} -gt 0 ] || die "$df declares none of the base image arguments (${!BASE_OF_ARG[*]})"
  ctx="$(context_hash "$ROOT" "$ign")"
  key="$({ echo "$BUILD_RECIPE $ref $key $ctx"; cat "$ROOT/$df"; [ -z "$ign" ] || cat "$ign"; buildah --version; } | sha)"
  archive="$CACHE/archives/$name.tar"
  if up_to_date "image-$name" "$ref" "$key" && [ -f "$archive" ]; then
    log "$ref: up to date"
    return 0
  fi
  local bundle="${KPLUG_BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
  [ -n "$bundle" ] && [ -f "$bundle" ] && ca=(--volume "$bundle:/etc/ssl/certs/ca-certificates.crt:ro")
  mkdir -p "$CACHE/logs" "$CACHE/archives"
  logf="$CACHE/logs/$name.log"
  new_tmpdir "$name"; tmp="$TMP"
  old="$(image_id "$ref")"
  log "$ref: building $df (${ctx#* } files in the context; log: $logf)"
  start=$SECONDS
  if ! buildah bud --pull=never --network host \
    --file "$ROOT/$df" ${ign:+--ignorefile "$ign"} "${args[@]}" "${ca[@]}" \
    --iidfile "$tmp/iid" --tag "$ref" "$ROOT" >"$logf" 2>&1; then
    echo "----- the end of $logf -----" >&2
    tail -n 40 "$logf" >&2
    echo "-----" >&2
    die "building $name ($ref from $df) failed; full log: $logf"
  fi
  id="$(<"$tmp/iid")"
  id="${id#sha256:}"
  user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$id")"
  if ! (check_user "$name" "$user"); then
    buildah rmi "$ref" >/dev/null 2>&1 || true
    rm -f "$CACHE/state/image-$name" "$archive"
    retire "$old"
    sweep
    exit 1
  fi
  buildah push --quiet "$id" "docker-archive:$tmp/archive.tar:$ref" >/dev/null
  info="$(archive_info "$tmp/archive.tar")"
  mv "$tmp/archive.tar" "$archive"
  read -r config raw gz <<<"$info"
  stamp_put "image-$name" "key=$key" "id=$id" "ref=$ref" "config=$config" "raw=$raw" "gzipped=$gz" \
    "seconds=$((SECONDS - start))"
  log "$ref: built in $((SECONDS - start)) s, $(mb "$raw") MB ($(mb "$gz") MB gzipped), user $user"
  [ "$old" = "$id" ] || retire "$old"
}

mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1000000 }'; }

# selected NAME...: the names given, checked, or all.
selected() {
  if [ $# -eq 0 ]; then image_names; return; fi
  local n
  for n in "$@"; do image_field "$n" 1 >/dev/null; echo "$n"; done
}

build() {
  local names n
  names="$(selected "$@")"
  bases
  for n in $names; do build_one "$n"; done
  sweep
}

# --- load ---------------------------------------------------------------------

load() {
  local names n addr snapshotter archive ref config have have_config complete listed
  names="$(selected "$@")"
  command -v ctr >/dev/null || die "ctr (containerd's client) not found"
  addr="${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}"
  snapshotter="${CONTAINERD_SNAPSHOTTER:-overlayfs}"
  [ -S "$addr" ] || die "no containerd socket at $addr (set CONTAINERD_ADDRESS)"
  export CONTAINERD_ADDRESS="$addr"
  for n in $names; do
    archive="$CACHE/archives/$n.tar"
    ref="$(stamp_get "image-$n" ref)"
    config="$(stamp_get "image-$n" config)"
    if [ ! -f "$archive" ] || [ -z "$ref" ]; then die "$n is not built: hack/images.sh build $n"; fi
    have="$(ctr -n k8s.io images ls "name==$ref" | awk 'NR == 2 {print $3}')"
    if [ -n "$have" ]; then
      have_config="$(ctr -n k8s.io content get "$have" 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null || true)"
      # Captured, not piped into grep -q: under pipefail, grep leaving at the
      # first match can kill ctr with SIGPIPE and fail the pipeline.
      complete="$(ctr -n k8s.io images check --quiet --snapshotter "$snapshotter" "name==$ref" || true)"
      if [ "$have_config" = "$config" ] && [ "$complete" = "$ref" ]; then
        log "$ref: already in containerd ($addr)"
        continue
      fi
    fi
    ctr -n k8s.io images import --snapshotter "$snapshotter" "$archive" >/dev/null ||
      die "ctr images import $archive failed (containerd at $addr)"
    listed="$(ctr -n k8s.io images ls --quiet "name==$ref" 2>&1)" ||
      die "ctr images ls after importing $ref failed: $listed"
    [ "$listed" = "$ref" ] || die "$ref missing from containerd after the import (ctr lists: ${listed:-nothing})"
    log "$ref: imported into containerd ($addr, namespace k8s.io)"
  done
}

# --- check --------------------------------------------------------------------

# probe: PROBE becomes a static program that prints the uid and gid it runs
# as (the runtime images have no shell or id), compiled in the rust-build base.
probe() {
  PROBE="$CACHE/tools/kplug-whoami"
  [ -x "$PROBE" ] && return 0
  [ -n "$(image_id "$BASE/rust-build")" ] || bases
  mkdir -p "$CACHE/tools"
  new_tmpdir probe
  printf '%s\n' '#include <stdio.h>' '#include <unistd.h>' \
    'int main(void) { printf("uid=%u gid=%u\n", getuid(), getgid()); return 0; }' >"$TMP/whoami.c"
  new_container "$BASE/rust-build"
  buildah run --network none --volume "$TMP:/probe" "$CTR" -- gcc -static -O2 -o /probe/whoami /probe/whoami.c >&2 ||
    die "compiling the uid probe failed"
  drop_container "$CTR"
  mv "$TMP/whoami" "$PROBE"
}

check() {
  local names n ref user c out first ids ep=() failed=0 probe_bin
  names="$(selected "$@")"
  probe
  probe_bin="$PROBE"
  for n in $names; do
    ref="$(image_ref "$n")"
    [ -n "$(image_id "$ref")" ] || die "$ref is not built: hack/images.sh build $n"
    user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$ref")"
    (check_user "$n" "$user") || { failed=1; continue; }
    mapfile -t ep < <(buildah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$ref")
    [ ${#ep[@]} -gt 0 ] || { log "$n: no ENTRYPOINT"; failed=1; continue; }
    new_container "$ref"; c="$CTR"
    if ! out="$(buildah run --network none "$c" -- "${ep[@]}" --help 2>&1)"; then
      log "$n: '${ep[*]} --help' failed in a container with no network:"
      printf '%s\n' "$out" | tail -n 20 >&2
      failed=1; drop_container "$c"; continue
    fi
    first="$(printf '%s\n' "$out" | grep -m 1 -i 'usage' || printf '%s\n' "$out" | head -n 1)"
    if ! ids="$(buildah run --network none --volume "$probe_bin:/.kplug-whoami:ro" "$c" -- /.kplug-whoami 2>&1)"; then
      log "$n: the uid probe failed: $ids"; failed=1; drop_container "$c"; continue
    fi
    drop_container "$c"
    if [ "$ids" != "uid=$NONROOT_UID gid=$NONROOT_UID" ]; then
      log "$n: runs as $ids, not uid=$NONROOT_UID gid=$NONROOT_UID"; failed=1; continue
    fi
    echo "ok $n $ref $ids help: $first"
  done
  [ "$failed" = 0 ] || die "some images failed the check (above)"
}

# --- sizes, list --------------------------------------------------------------

sizes() {
  local n ref raw gz b
  printf '%-56s %12s %12s\n' IMAGE "SIZE (MB)" "GZIPPED (MB)"
  for n in $(image_names); do
    ref="$(image_ref "$n")"
    raw="$(stamp_get "image-$n" raw)"
    gz="$(stamp_get "image-$n" gzipped)"
    if [ -z "$raw" ]; then printf '%-56s %12s\n' "$ref" "(not built)"; continue; fi
    printf '%-56s %12s %12s\n' "$ref" "$(mb "$raw")" "$(mb "$gz")"
  done
  for b in debian rust-build cc-nonroot python; do
    # (buildah prints it rounded, with a unit.)
    raw="$(buildah images --format '{{.Size}}' "$BASE/$b" 2>/dev/null | head -n 1 |
      awk '{v = $1; if ($2 == "GB") v *= 1000; if ($2 == "kB") v /= 1000; printf "%.1f", v}')"
    printf '%-56s %12s\n' "$BASE/$b" "${raw:-(not made)}"
  done
}

verify() {
  local ref user failed=0
  [ $# -gt 0 ] || usage
  for ref in "$@"; do
    [ -n "$(image_id "$ref")" ] || die "no image $ref in buildah's storage"
    user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$ref")"
    if (check_user "$ref" "$user"); then echo "ok $ref runs as $user"; else failed=1; fi
  done
  [ "$failed" = 0 ]
}

list() {
  local n
  for n in $(image_names); do echo "$n $(image_ref "$n") $(image_field "$n" 1)"; done
}

# built_id: the config digest of the last build of NAME, which containerd reports
# as the image ID of the pods that run it.
built_id() {
  [ $# -eq 1 ] || usage
  image_field "$1" 1 >/dev/null
  local config
  config="$(stamp_get "image-$1" config)"
  [ -n "$config" ] || die "$1 is not built: hack/images.sh build $1"
  echo "$config"
}

# --- main ---------------------------------------------------------------------

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  bases)
    case "${1:-}" in
      --refresh) KPLUG_IMAGES_REFRESH=1 ;;
      "") ;;
      *) usage ;;
    esac
    lock; bases ;;
  build) need_root; lock; build "$@" ;;
  load) need_root; lock; load "$@" ;;
  check) need_root; lock; check "$@" ;;
  sizes) sizes ;;
  list) list ;;
  id) built_id "$@" ;;
  verify) need_root; verify "$@" ;;
  *) usage ;;
esac
