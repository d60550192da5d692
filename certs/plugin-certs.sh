#!/usr/bin/env bash
# Makes the certificates of mutual TLS between kplug and its plugins with
# `kplug-apiserver plugin-certs`, from one plugin CA.
#
#   certs/plugin-certs.sh [--out-dir DIR] ca
#   certs/plugin-certs.sh [--out-dir DIR] client [--common-name NAME]
#   certs/plugin-certs.sh [--out-dir DIR] serving DNS_NAME... [--ip IP]... [--days N]
#
# DIR (default certs/plugins) holds the plugin CA, ca.crt and ca.key: made
# by the first command, reused by the next ones.
#   ca       only the plugin CA: kplug's plugin CA when kplug signs the
#            plugins' certificates itself (the Secret kplug-plugin-ca).
#   client   kplug's client certificate, DIR/kplug-client.crt and .key
#            (extended key usage clientAuth only, 365 days): kplug's
#            --plugin-client-cert-file and --plugin-client-key-file.
#   serving  a plugin's serving certificate, DIR/plugins/DNS_NAME/tls.crt
#            and tls.key (serverAuth only, so it cannot call another
#            plugin), for the names kplug verifies: the plugin's
#            KPLUG_SERVER_NAME, else the host of its KPLUG_ADVERTISE.
# ca.crt is both kplug's --plugin-ca-file and the plugins'
# KPLUG_CLIENT_CA_FILE. Keys are written mode 0600; stdout lists the files
# written. See docs/src/guides/certificates.md ("Plugin certificates") for rotation.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "certs/plugin-certs.sh: $*" >&2; exit 1; }
usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}
# shellcheck source=certs/kplug-apiserver.sh
. "$REPO/certs/kplug-apiserver.sh"

out_dir="$REPO/certs/plugins"
case "${1:-}" in
  -h|--help|"") usage ;;
  --out-dir) [ $# -ge 2 ] || die "--out-dir needs a directory"; out_dir="$2"; shift 2 ;;
  --out-dir=*) out_dir="${1#*=}"; shift ;;
esac
case "${1:-}" in
  ca|client|serving) ;;
  *) usage ;;
esac

umask 077 # private keys: owner only
kplug_apiserver plugin-certs --out-dir "$out_dir" "$@"
