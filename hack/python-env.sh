#!/usr/bin/env bash
# Creates or updates the virtualenv for kplug's Python SDK and examples at
# ${KPLUG_VENV:-$HOME/.cache/kplug/venv}: the SDK (editable, with its test
# extras), the PostgreSQL example plugin (editable, with psycopg) and the
# Python operator example (editable, with the kubernetes client). A quick
# no-op when nothing it installs from changed. Afterwards, from the repo root:
#   "${KPLUG_VENV:-$HOME/.cache/kplug/venv}/bin/pytest" sdk/python examples
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${KPLUG_VENV:-$HOME/.cache/kplug/venv}"
python="${PYTHON:-python3}"

# A change to any of these (or a move of the checkout, which editable
# installs point at) reinstalls.
inputs=(
  "$root/hack/python-env.sh"
  "$root/sdk/python/pyproject.toml"
  "$root/examples/database-table/postgresql-plugin/pyproject.toml"
  "$root/examples/python-operator/pyproject.toml"
)
stamp="$venv/.kplug-stamp"
want="$({ echo "$root"; "$python" --version; cat "${inputs[@]}"; } | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(<"$stamp")" == "$want" ]] && "$venv/bin/python" -c '' 2>/dev/null; then
  exit 0
fi

# A virtualenv made by another Python (or broken) is made afresh.
if [[ "$("$venv/bin/python" --version 2>/dev/null)" != "$("$python" --version)" ]]; then
  echo "== creating the Python virtualenv $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv --clear "$venv"
fi
echo "== installing kplug's Python packages into $venv" >&2
rm -f "$stamp"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --editable "$root/sdk/python[test]" \
  --editable "$root/examples/database-table/postgresql-plugin[test]" \
  --editable "$root/examples/python-operator[test]" \
  `# the Prometheus project's strict OpenMetrics parser, for the Rust tests of /metrics` \
  "prometheus-client>=0.20"
echo "$want" >"$stamp"
