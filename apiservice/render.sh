#!/usr/bin/env bash
# Prints apiservice/apiservice.yaml with spec.caBundle filled in (base64 of
# CA_FILE, one line) and, if given, spec.service substituted.
#
#   apiservice/render.sh CA_FILE [SERVICE [NAMESPACE [PORT]]] | kubectl apply -f -
#
# SERVICE, NAMESPACE and PORT default to kplug, kplug-system and 443.
# CA_FILE may hold several PEM certificates (old + new CA during a rotation).
# Example for kplug outside the cluster, through an ExternalName Service:
#   apiservice/render.sh "$STATE/ca.crt" kplug-e2e default 8443
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$HERE/apiservice.yaml"

die() { echo "apiservice/render.sh: $*" >&2; exit 1; }
usage() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}" >&2
  exit 2
}

case "${1:-}" in ""|-h|--help) usage ;; esac
[ $# -le 4 ] || usage
ca_file="$1"
service="${2:-kplug}"
namespace="${3:-kplug-system}"
port="${4:-443}"

[ -r "$ca_file" ] || die "cannot read CA file '$ca_file'"
grep -q -- '-----BEGIN CERTIFICATE-----' "$ca_file" || die "$ca_file holds no PEM certificate"
if grep -q -- 'PRIVATE KEY-----' "$ca_file"; then
  die "$ca_file holds a private key; give the CA certificate (ca.crt), not its key"
fi
dns_label='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'
[[ "$service" =~ $dns_label && ${#service} -le 63 ]] || die "SERVICE must be a DNS label, got '$service'"
[[ "$namespace" =~ $dns_label && ${#namespace} -le 63 ]] || die "NAMESPACE must be a DNS label, got '$namespace'"
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "PORT must be 1..65535, got '$port'"

ca_bundle="$(base64 <"$ca_file" | tr -d '\n')" # = base64 -w0, also on macOS

# Substitute the placeholder and the three fields of spec.service (and
# nothing else), then check that each substitution happened exactly once.
out="$(awk -v ca="$ca_bundle" -v svc="$service" -v ns="$namespace" -v port="$port" '
  !started && /^#/ { next }   # the template'"'"'s header: "do not apply as is"
  !started { started = 1; print "# Rendered by apiservice/render.sh from apiservice/apiservice.yaml." }
  /^  service:[[:space:]]*$/ { in_service = 1; print; next }
  in_service && /^    name:/      { sub(/name:.*/, "name: " svc); n++ }
  in_service && /^    namespace:/ { sub(/namespace:.*/, "namespace: " ns); n++ }
  in_service && /^    port:/      { sub(/port:.*/, "port: " port); n++ }
  in_service && !/^    /          { in_service = 0 }
  /^  caBundle: CA_BUNDLE_PLACEHOLDER[[:space:]]*$/ { sub(/CA_BUNDLE_PLACEHOLDER/, ca); c++ }
  { print }
  END { if (n != 3 || c != 1) exit 3 }
' "$TEMPLATE")" || die "$TEMPLATE no longer has the expected spec.service and caBundle lines"

printf '%s\n' "$out"
