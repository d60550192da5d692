#!/usr/bin/env bash
# Installs what kplug's tests need and a fresh machine may lack: kubectl,
# curl, MariaDB (Debian packages) and the Python virtualenv. Idempotent and
# quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v kubectl >/dev/null || need_apt+=(kubectl)
command -v curl >/dev/null || need_apt+=(curl)
{ command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ]; } || need_apt+=(mariadb-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian starts a system MariaDB on install; the tests run their own.
  systemctl disable --now mariadb >/dev/null 2>&1 || service mariadb stop >/dev/null 2>&1 || true
fi

if [ -x hack/python-env.sh ]; then
  hack/python-env.sh
fi
