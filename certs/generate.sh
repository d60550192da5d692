#!/usr/bin/env bash
# Makes kplug's serving certificate (and, unless one is given, its CA) with
# `kplug-apiserver certs`, and prints the APIService caBundle on stdout.
#
#   certs/generate.sh [SERVICE [NAMESPACE [OUT_DIR]]] [--ca-cert FILE --ca-key FILE] [--days N]
#
# SERVICE defaults to kplug, NAMESPACE to kplug-system, OUT_DIR to certs/out.
# Writes OUT_DIR/ca.crt, OUT_DIR/ca.key (only when no CA is given),
# OUT_DIR/tls.crt and OUT_DIR/tls.key, with the SANs SERVICE,
# SERVICE.NAMESPACE, SERVICE.NAMESPACE.svc, SERVICE.NAMESPACE.svc.cluster.local,
# the same four for SERVICE-registry (the headless Service plugins heartbeat through),
# localhost, 127.0.0.1 and ::1. --ca-cert/--ca-key reuse an existing CA, to rotate
# the serving certificate alone (see docs/src/guides/certificates.md). Other options are
# passed to `kplug-apiserver certs` unchanged.
#
# The binary: see certs/kplug-apiserver.sh ($KPLUG_APISERVER overrides).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=certs/kplug-apiserver.sh
. "$REPO/certs/kplug-apiserver.sh"

die() { echo "certs/generate.sh: $*" >&2; exit 1; }
usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

positional=()
passthrough=()
ca_cert="" ca_key=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage ;;
    --ca-cert) [ $# -ge 2 ] || die "--ca-cert needs a file"; ca_cert="$2"; shift 2 ;;
    --ca-cert=*) ca_cert="${1#*=}"; shift ;;
    --ca-key) [ $# -ge 2 ] || die "--ca-key needs a file"; ca_key="$2"; shift 2 ;;
    --ca-key=*) ca_key="${1#*=}"; shift ;;
    --*=*) passthrough+=("$1"); shift ;;
    --*) [ $# -ge 2 ] || die "$1 needs a value"; passthrough+=("$1" "$2"); shift 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ "${#positional[@]}" -le 3 ] || usage

service="${positional[0]:-kplug}"
namespace="${positional[1]:-kplug-system}"
out_dir="${positional[2]:-$REPO/certs/out}"

dns_label='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'
[[ "$service" =~ $dns_label && ${#service} -le 63 ]] || die "SERVICE must be a DNS label, got '$service'"
[[ "$namespace" =~ $dns_label && ${#namespace} -le 63 ]] || die "NAMESPACE must be a DNS label, got '$namespace'"

if [ -n "$ca_cert$ca_key" ]; then
  [ -n "$ca_cert" ] && [ -n "$ca_key" ] || die "give both --ca-cert and --ca-key"
  [ -r "$ca_cert" ] || die "cannot read $ca_cert"
  [ -r "$ca_key" ] || die "cannot read $ca_key"
elif [ -e "$out_dir/ca.key" ]; then
  # A new CA would replace the one the APIService (caBundle) and the plugins
  # (kplug-ca ConfigMaps) trust: the aggregator and every plugin would stop
  # trusting kplug at once.
  die "$out_dir already holds a CA. To rotate the serving certificate, pass
  --ca-cert $out_dir/ca.crt --ca-key $out_dir/ca.key; to rotate the CA, use a
  new OUT_DIR and follow docs/src/guides/certificates.md (CA rotation)."
fi

umask 077 # private keys: owner only
mkdir -p "$out_dir"

# Reusing the CA of OUT_DIR itself: hand the binary copies, so it never reads
# a file it is rewriting.
tmp=""
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
if [ -n "$ca_cert" ]; then
  if [ "$(realpath "$ca_cert")" = "$(realpath -m "$out_dir/ca.crt")" ] ||
     [ "$(realpath "$ca_key")" = "$(realpath -m "$out_dir/ca.key")" ]; then
    tmp="$(mktemp -d)"
    cp "$ca_cert" "$tmp/ca.crt"
    cp "$ca_key" "$tmp/ca.key"
    ca_cert="$tmp/ca.crt" ca_key="$tmp/ca.key"
  fi
  passthrough=(--ca-cert "$ca_cert" --ca-key "$ca_key" "${passthrough[@]}")
fi

# stdout: the caBundle (base64 of ca.crt), exactly as the binary prints it.
kplug_apiserver certs --service "$service" --namespace "$namespace" --out-dir "$out_dir" "${passthrough[@]}"

for f in tls.crt tls.key; do
  [ -s "$out_dir/$f" ] || die "kplug-apiserver certs did not write $out_dir/$f"
done
echo "certs/generate.sh: wrote $out_dir/{tls.crt,tls.key}$([ -n "$ca_cert" ] || echo ' and a new CA (ca.crt, ca.key)')" >&2
