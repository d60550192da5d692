#!/usr/bin/env bash
# Installs what kplug's tests need and a fresh machine may lack: kubectl,
# curl, PostgreSQL and MariaDB (Debian packages), the Python virtualenv and
# a kube-apiserver. Idempotent and
# quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v kubectl >/dev/null || need_apt+=(kubectl)
command -v curl >/dev/null || need_apt+=(curl)
command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
{ command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ]; } || need_apt+=(mariadb-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian starts system servers on install; the tests run their own.
  for service in mariadb postgresql; do
    systemctl disable --now "$service" >/dev/null 2>&1 || service "$service" stop >/dev/null 2>&1 || true
  done
fi

hack/python-env.sh

# The cluster end-to-end test runs a real kube-apiserver, built once from
# Debian's source and cached under ~/.cache/kplug (about 6 minutes the first time).
hack/kube-build.sh >/dev/null
