"""A page opened in headless Debian Chromium, as a reader's browser would, with what it wrote to its console."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

# Chromium logs every console message (console.log and console.error alike, and uncaught exceptions) at INFO with
# this tag when started with --enable-logging=stderr.
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (.*)$")

# The flags of a machine with no network: without the background-networking ones Chromium keeps trying to reach
# Google's services.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


def console_messages(page: Path, screenshot: Path) -> list[str]:
    """Opens ``page`` (a file), saves a screenshot of it, and returns what it wrote to its console."""
    with tempfile.TemporaryDirectory(prefix="kplug-chromium-") as profile:
        done = subprocess.run(
            [
                "chromium",
                *FLAGS,
                f"--user-data-dir={profile}",
                "--window-size=1280,900",
                f"--screenshot={screenshot}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    if done.returncode != 0 or not screenshot.exists():
        raise RuntimeError(f"chromium could not open {page} (exit code {done.returncode}):\n{done.stderr[-2000:]}")
    return [match.group(1) for line in done.stderr.splitlines() if (match := CONSOLE.search(line))]
