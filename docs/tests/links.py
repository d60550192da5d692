"""Every internal link of a built book, checked: the file it names exists inside the book, and so does the anchor."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Links that leave the book on purpose; none is followed (the test machine has no network).
EXTERNAL_SCHEMES = ("http", "https", "mailto")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"] or "")
        for attribute in ("href", "src"):
            if values.get(attribute) and tag in ("a", "link", "img", "script", "iframe"):
                self.links.append(values[attribute] or "")


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def broken_links(root: Path) -> list[str]:
    """``page: link (why)`` for each link of the HTML under ``root`` that does not resolve inside it."""
    root = root.resolve()
    pages = {path: _parse(path) for path in sorted(root.rglob("*.html"))}
    broken = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme in EXTERNAL_SCHEMES or parts.scheme == "data" or (not parts.path and not parts.fragment):
                continue
            where = f"{path.relative_to(root)}: {link}"
            if parts.scheme or parts.netloc:
                broken.append(f"{where} (a scheme the book does not use)")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if root not in target.parents:
                broken.append(f"{where} (outside the book)")
            elif not target.exists():
                broken.append(f"{where} (no such file)")
            elif parts.fragment:
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where} (no anchor #{parts.fragment} in {target.relative_to(root)})")
    return broken
