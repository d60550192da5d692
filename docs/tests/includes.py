"""Code a page shows by mdBook include: the file it names is the one the tests build and run."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def assert_included(page: Path, source: Path, anchor: str) -> None:
    """``page`` shows the part of ``source`` between its ``ANCHOR: anchor`` and ``ANCHOR_END: anchor`` lines."""
    relative = Path("../" * (len(page.relative_to(REPO / "docs" / "src").parents) - 1)) / "../.." / source.relative_to(REPO)
    included = f"{{{{#include {relative.as_posix()}:{anchor}}}}}"
    assert included in page.read_text(), f"{page} does not show {source} ({included})"
    text = source.read_text()
    assert f"ANCHOR: {anchor}\n" in text and f"ANCHOR_END: {anchor}\n" in text, f"{source} lacks the anchor {anchor}"
