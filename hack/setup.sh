#!/usr/bin/env bash
# Installs what kplug's tests need and the machine may lack. Idempotent.
set -euo pipefail

need_apt=()
command -v kubectl >/dev/null || need_apt+=(kubectl)
command -v curl >/dev/null || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
