"""A page's shell block as steps a test can run one by one: each command (continuation lines and here-documents
included) with the output the page shows for it, the ``# `` lines right below it."""

from __future__ import annotations

import re
from dataclasses import dataclass

HEREDOC = re.compile(r"<<-?'?(\w+)'?")
# Where a page elides the rest of an output: "# ... (objectStatus, and ...)".
ELISION = re.compile(r"^\.\.\.( |$)")
# Ages in kubectl's tables ("4s", "2m3s") are the clock's, not the page's.
AGE = re.compile(r"^\d+[smhd](\d+[smh])?$")


@dataclass
class Step:
    command: str
    shown: list[str]


def steps(block: str) -> list[Step]:
    """The commands of a shell block, each with the output lines the page shows below it. A comment after a blank
    line, or before a command, is prose, not output."""
    lines = block.splitlines()
    found: list[Step] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        command = [line]
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        if match := HEREDOC.search(line):
            while i + 1 < len(lines):
                i += 1
                command.append(lines[i])
                if lines[i] == match.group(1):
                    break
        shown = []
        while i + 1 < len(lines) and lines[i + 1].startswith("# "):
            i += 1
            shown.append(lines[i][2:])
        found.append(Step("\n".join(command), shown))
        i += 1
    return found


def differences(shown: list[str], printed: str) -> list[str]:
    """Where ``printed`` is not what the page shows: line by line, words compared with runs of spaces as one, ages
    as any age, up to an elision. A command the page shows no output for may print anything."""
    if not shown:
        return []
    actual = printed.rstrip("\n").splitlines()
    found = []
    for number, expected in enumerate(shown):
        if ELISION.match(expected):
            return found
        got = actual[number] if number < len(actual) else "(nothing)"
        expected_words, got_words = expected.split(), got.split()
        same = len(expected_words) == len(got_words) and all(
            e == g or (AGE.match(e) and AGE.match(g)) for e, g in zip(expected_words, got_words)
        )
        if not same:
            found.append(f"line {number + 1}: the page shows {expected!r}, the command printed {got!r}")
    if len(actual) > len(shown):
        found.append(f"the command printed {len(actual) - len(shown)} more line(s) than the page shows: {actual[len(shown):]}")
    return found
