"""The shell steps that kplug's READMEs give users, as scripts tests can run."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path


def shell_blocks(markdown: Path, heading: str) -> list[str]:
    """The ```sh blocks of the section under ``heading`` (up to the next heading of its level or higher).

    Lines inside fenced code blocks are never headings (a shell comment is not one). A block indented under a list
    item comes without its indentation.
    """
    section: list[str] | None = None
    level = 0
    fenced = False
    for line in markdown.read_text().splitlines(keepends=True):
        if line.lstrip(" ").startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"(#+) (.*)\n?$", line)):
            if section is None and match.group(2) == heading:
                section, level = [], len(match.group(1))
                continue
            if section is not None and len(match.group(1)) <= level:
                break
        if section is not None:
            section.append(line)
    if section is None:
        raise ValueError(f"{markdown}: no heading {heading!r}")
    blocks = re.findall(r"^( *)```sh\n(.*?)^\1```", "".join(section), re.MULTILINE | re.DOTALL)
    return [textwrap.dedent(block) if indent else block for indent, block in blocks]


def replace_line(script: str, starts_with: str, replacement: str) -> str:
    """``script`` with its one line that starts with ``starts_with`` replaced; fails if there is not exactly one."""
    lines = script.splitlines()
    found = [i for i, line in enumerate(lines) if line.startswith(starts_with)]
    if len(found) != 1:
        raise ValueError(f"expected one line starting with {starts_with!r}, found {len(found)}:\n{script}")
    lines[found[0]] = replacement
    return "\n".join(lines) + "\n"


def up_to_line(script: str, starts_with: str) -> str:
    """``script`` up to (without) its first line starting with ``starts_with``."""
    lines = script.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(starts_with):
            return "\n".join(lines[:i]) + "\n"
    raise ValueError(f"no line starting with {starts_with!r}:\n{script}")


def replace_in_line(script: str, line_contains: str, old: str, new: str) -> str:
    """``script`` with ``old`` replaced by ``new`` in its one line containing ``line_contains``.

    Fails unless exactly one line contains ``line_contains``, and it contains ``old``.
    """
    lines = script.splitlines()
    found = [i for i, line in enumerate(lines) if line_contains in line]
    if len(found) != 1:
        raise ValueError(f"expected one line containing {line_contains!r}, found {len(found)}:\n{script}")
    if old not in lines[found[0]]:
        raise ValueError(f"no {old!r} in the line {lines[found[0]]!r}")
    lines[found[0]] = lines[found[0]].replace(old, new)
    return "\n".join(lines) + "\n"
