"""Debian's Prometheus (``hack/docs.sh install`` unpacks it) scraping a standalone kplug, for the monitoring guide's
queries: it scrapes as the standalone admin, with the client certificate of the kubeconfig kplug wrote."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS = Path(os.environ.get("KPLUG_TOOLS", Path.home() / ".cache" / "kplug" / "tools")) / "prometheus" / "usr" / "bin" / "prometheus"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expression: str) -> dict[str, Any]:
        """The HTTP API's answer to an instant query: ``status`` is ``error`` for a query Prometheus refuses."""
        request = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as refused:  # 400 and 422 carry the error as JSON
            return json.load(refused)

    def samples(self, expression: str) -> list[dict[str, Any]]:
        answer = self.query(expression)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]


@contextmanager
def prometheus(kubeconfig: Path, work: Path, timeout: float = 60) -> Iterator[Prometheus]:
    """Prometheus scraping the kplug of ``kubeconfig`` every second; yields once it holds two scrapes of kplug, so
    that ``rate()`` over them has an answer."""
    config = yaml.safe_load(kubeconfig.read_text())
    server = urllib.parse.urlparse(config["clusters"][0]["cluster"]["server"])
    files = {
        "ca.crt": config["clusters"][0]["cluster"]["certificate-authority-data"],
        "admin.crt": config["users"][0]["user"]["client-certificate-data"],
        "admin.key": config["users"][0]["user"]["client-key-data"],
    }
    for name, data in files.items():
        (work / name).write_bytes(base64.b64decode(data))
    scrape = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "kplug",
                "scheme": "https",
                "tls_config": {"ca_file": str(work / "ca.crt"), "cert_file": str(work / "admin.crt"), "key_file": str(work / "admin.key")},
                "static_configs": [{"targets": [server.netloc]}],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(scrape))
    listen = f"127.0.0.1:{free_port()}"
    log = work / "prometheus.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address={listen}",
            ],
            stdout=output,
            stderr=output,
        )
    try:
        running = Prometheus(f"http://{listen}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if running.samples('count_over_time(up{job="kplug"}[1m]) >= 2 and up{job="kplug"} == 1'):
                    break
            except (OSError, ValueError):
                pass  # not listening yet, or starting (503, not JSON)
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus has not scraped kplug twice within {timeout} s; its log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield running
    finally:
        process.terminate()
        process.wait(30)
