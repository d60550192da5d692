#!/usr/bin/env bash
# Regenerates the committed gRPC stubs (src/kplug/_proto) from proto/.
# Needs grpcio-tools, pinned in the `test` extra: hack/python-env.sh installs
# it into the kplug virtualenv, which this script uses when present.
# Usage: sdk/python/generate.sh [--out DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-${KPLUG_VENV:-$HOME/.cache/kplug/venv}/bin/python}"
if [ ! -x "$python" ]; then
  python=python3
fi
exec "$python" "$here/tools/generate_protos.py" "$@"
