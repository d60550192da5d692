"""The book (``docs/``): its reference pages are what the code gives, it builds with mdBook, every internal link
and anchor of the built HTML resolves, and headless Chromium opens the start page and the first page of every
part without a console message. Needs the workspace built (``hack/test.sh`` builds it first), mdBook and
Chromium (``hack/setup.sh`` installs both)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chromium import console_messages
from links import broken_links

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "src" / "reference"
MDBOOK = Path(os.environ.get("KPLUG_TOOLS", Path.home() / ".cache" / "kplug" / "tools")) / "bin" / "mdbook"
# Kept after the run: the start page as Chromium drew it.
ARTIFACTS = REPO / "target" / "book-test"
# The start page, and the first page of every part of SUMMARY.md.
OPENED = [
    "index.html",
    "getting-started/quick-start.html",
    "concepts/architecture.html",
    "guides/plugin-rust.html",
    "reference/kplug-apiserver.html",
    "benchmarks.html",
    "troubleshooting.html",
]


def reference_check(reference: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "hack" / "docs" / "reference.py"), "check", "--reference", str(reference)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def test_the_reference_pages_are_what_the_code_gives() -> None:
    done = reference_check(REFERENCE)
    assert done.returncode == 0, done.stderr


def test_a_flag_changed_without_its_page_fails_the_check(tmp_path: Path) -> None:
    """What the check sees when the code and the page part: here the page still documents a default the code no
    longer has."""
    shutil.copytree(REFERENCE, tmp_path, dirs_exist_ok=True)
    page = tmp_path / "kplug-apiserver.md"
    text = page.read_text()
    assert "[default: 127.0.0.1:8443]" in text
    page.write_text(text.replace("[default: 127.0.0.1:8443]", "[default: 127.0.0.1:9443]", 1))
    done = reference_check(tmp_path)
    assert done.returncode == 1, done.stderr
    assert "kplug-apiserver.md" in done.stderr and "127.0.0.1:9443" in done.stderr, done.stderr
    assert "reference.py write" in done.stderr, done.stderr


def metric_names(markdown: str) -> set[str]:
    """The metrics a table's rows name in their first cell, the process's own (one row of the guide) left out."""
    cells = re.findall(r"^\| (.+?) \|", markdown, re.MULTILINE)
    return {name for cell in cells for name in re.findall(r"`([a-z_]+)`", cell) if not name.startswith("process_")}


MONITORING = REPO / "docs" / "src" / "guides" / "monitoring.md"


def test_the_monitoring_guide_explains_every_metric_kplug_registers() -> None:
    """The guide's table says what each metric's labels mean; the generated reference says which metrics exist."""
    registered = metric_names((REFERENCE / "metrics.md").read_text())
    explained = metric_names(MONITORING.read_text().split("## Trace context")[0])
    # Cluster mode only: standalone kplug does not register delegated authentication's families.
    cluster_only = {name for name in explained if name.startswith("kplug_auth_")}
    assert registered - explained == set(), "metrics kplug registers that the monitoring guide does not explain"
    assert explained - registered - cluster_only == set(), "metrics the monitoring guide explains that kplug does not register"


def test_the_monitoring_guide_explains_every_metric_the_operator_registers() -> None:
    registered = metric_names((REFERENCE / "operator-metrics.md").read_text())
    explained = metric_names(MONITORING.read_text().split("## Operator metrics")[1])
    assert registered - explained == set(), "metrics the operator registers that the monitoring guide does not explain"
    assert explained - registered == set(), "metrics the monitoring guide explains that the operator does not register"


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("book")
    done = subprocess.run(
        [str(MDBOOK), "build", str(REPO / "docs"), "--dest-dir", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    # mdBook reports some mistakes (a missing include, a bad SUMMARY entry) as warnings and builds anyway.
    assert not [line for line in done.stderr.splitlines() if "WARN" in line or "ERROR" in line], done.stderr
    return out


def test_every_link_and_anchor_of_the_book_resolves(book: Path) -> None:
    assert (book / "index.html").exists()
    assert len(list(book.rglob("*.html"))) >= 30, sorted(book.rglob("*.html"))
    assert broken_links(book) == []


def test_the_link_check_finds_a_missing_page_a_missing_anchor_and_a_way_out(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<h1 id="top">x</h1><a href="#top">ok</a><a href="sub/page.html#here">ok</a>'
        '<a href="sub/page.html#gone">anchor</a><a href="absent.html">page</a><a href="../outside.html">out</a>'
        '<a href="https://example.com/">external, not followed</a>'
    )
    (tmp_path / "sub" / "page.html").write_text('<h2 id="here">y</h2><img src="../missing.png">')
    assert broken_links(tmp_path) == [
        "index.html: sub/page.html#gone (no anchor #gone in sub/page.html)",
        "index.html: absent.html (no such file)",
        "index.html: ../outside.html (outside the book)",
        "sub/page.html: ../missing.png (no such file)",
    ]


def test_chromium_opens_the_start_page_and_each_part_without_a_console_message(book: Path, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    noisy = {}
    for page in OPENED:
        screenshot = ARTIFACTS / "start-page.png" if page == "index.html" else tmp_path / f"{page.replace('/', '-')}.png"
        if messages := console_messages(book / page, screenshot):
            noisy[page] = messages
    assert noisy == {}
    # A blank page would be a small PNG; the start page with its text and the picture is far larger.
    assert (ARTIFACTS / "start-page.png").stat().st_size > 20_000


def test_chromium_reports_what_a_page_writes_to_its_console(tmp_path: Path) -> None:
    page = tmp_path / "noisy.html"
    page.write_text('<p>x</p><script>console.error("planted"); notAFunction();</script>')
    messages = console_messages(page, tmp_path / "noisy.png")
    assert any('"planted"' in m for m in messages), messages
    assert any("ReferenceError" in m for m in messages), messages
