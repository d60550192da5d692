# shellcheck shell=bash
# The images hack/cluster.sh imports into the node's containerd itself: the
# pause image and the tests' toolbox. Sourced by hack/cluster.sh (needs DIR,
# HACK_DIR and its helpers).

# The pause image from the same source as the binaries (no registry here),
# and a toolbox for tests (Debian's static busybox: sh, nslookup, nc, httpd;
# its wget crashes in a container without glibc's files, so tests use nc).
PAUSE_IMAGE=registry.k8s.io/pause:3.4.1
TOOLBOX_IMAGE=kplug.local/toolbox:1
import_cluster_images() {
  local cache work
  cache="$(dirname "$("$HACK_DIR/kube-build.sh" --dir)")/images"
  mkdir -p "$cache"
  if [ ! -f "$cache/pause.tar" ]; then
    local tarball
    tarball="$(ls "${KPLUG_CACHE:-$HOME/.cache/kplug}"/src/kubernetes_*really1.20.2*.orig.tar.* | head -n1)"
    work="$(mktemp -d)"
    tar -xf "$tarball" -C "$work" --wildcards '*/build/pause/linux/pause.c' --strip-components=4
    mkdir "$work/root"
    gcc -Os -static -o "$work/root/pause" "$work/pause.c" -DVERSION=v3.4.1-kplug
    strip "$work/root/pause"
    oci_image_archive "$work/root" /pause 65535 "$PAUSE_IMAGE" "$cache/pause.tar"
    rm -rf "$work"
  fi
  work="$(mktemp -d)"
  mkdir -p "$work/bin" "$work/tmp"
  chmod 1777 "$work/tmp"
  cp /bin/busybox "$work/bin/busybox"
  oci_image_archive "$work" /bin/busybox 65534 "$TOOLBOX_IMAGE" "$cache/toolbox.tar"
  rm -rf "$work"
  local image
  for image in pause toolbox; do
    ctr --address "$DIR/containerd/containerd.sock" -n k8s.io images import "$cache/$image.tar" >/dev/null
  done
}

# oci_image_archive ROOT ENTRYPOINT UID REF OUT: an OCI image archive (what
# `ctr images import` reads) of one layer holding the folder ROOT, run as UID.
oci_image_archive() {
  local root="$1" entry="$2" uid="$3" ref="$4" out="$5" layout
  layout="$(mktemp -d)"
  mkdir -p "$layout/blobs/sha256"
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -C "$root" -cf "$layout/layer.tar" .
  local layer_digest layer_size config config_digest manifest manifest_digest
  layer_digest="$(sha256sum "$layout/layer.tar" | cut -d' ' -f1)"
  layer_size="$(stat -c %s "$layout/layer.tar")"
  mv "$layout/layer.tar" "$layout/blobs/sha256/$layer_digest"
  config="{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Entrypoint\":[\"$entry\"],\"User\":\"$uid:$uid\"},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_digest\"]}}"
  config_digest="$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)"
  printf '%s' "$config" >"$layout/blobs/sha256/$config_digest"
  manifest="{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$config_digest\",\"size\":${#config}},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$layer_digest\",\"size\":$layer_size}]}"
  manifest_digest="$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)"
  printf '%s' "$manifest" >"$layout/blobs/sha256/$manifest_digest"
  printf '%s' "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$manifest_digest\",\"size\":${#manifest},\"annotations\":{\"io.containerd.image.name\":\"$ref\",\"org.opencontainers.image.ref.name\":\"${ref##*:}\"}}]}" >"$layout/index.json"
  printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  tar -C "$layout" -cf "$out.tmp" oci-layout index.json blobs
  mv -f "$out.tmp" "$out"
  rm -rf "$layout"
}
