#!/usr/bin/env bash
# Installs what kplug's tests need and a fresh machine may lack: kubectl,
# curl, nghttp, PostgreSQL and MariaDB, what the real cluster needs (containerd,
# runc, CNI plugins, iptables; Debian packages), Chromium for the book's
# test, the Python virtualenv, mdBook and the Kubernetes components. Idempotent and
# quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v kubectl >/dev/null || need_apt+=(kubectl)
command -v curl >/dev/null || need_apt+=(curl)
# A second HTTP/2 client for the early-answer tests (apiserver/tests/early_answers.rs).
command -v nghttp >/dev/null || need_apt+=(nghttp2-client)
command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
{ command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ]; } || need_apt+=(mariadb-server)
# The real cluster (hack/cluster.sh): a container runtime, CNI plugins,
# kube-proxy's iptables and conntrack, and busybox for the test toolbox image.
command -v containerd >/dev/null || need_apt+=(containerd)
command -v runc >/dev/null || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
command -v iptables >/dev/null || need_apt+=(iptables)
command -v conntrack >/dev/null || need_apt+=(conntrack)
command -v ss >/dev/null || need_apt+=(iproute2)
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
# libFuzzer (C++), which the fuzz targets link (fuzz/, hack/fuzz.sh smoke).
command -v c++ >/dev/null || need_apt+=(g++)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
# The book's test opens its pages in headless Chromium (docs/tests).
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian starts system servers on install; the tests run their own.
  for service in mariadb postgresql containerd; do
    systemctl disable --now "$service" >/dev/null 2>&1 || service "$service" stop >/dev/null 2>&1 || true
  done
fi

hack/python-env.sh

# mdBook, which builds the book (docs/), from crates.io, and Prometheus, which
# runs the monitoring guide's queries, from Debian: once.
hack/docs.sh install

# The end-to-end tests run real Kubernetes components, built once from
# Debian's source and cached under ~/.cache/kplug (about 5 minutes the first time).
hack/kube-build.sh >/dev/null
