"""Reference sections from a program's own ``--help``: what clap and argparse print is what the code defines, read
into a usage line, tables of options and subcommands, and examples."""

from __future__ import annotations

import html
import os
import re
import subprocess
from dataclasses import dataclass

# A section header: no indentation, a name and a colon alone ("Options:", "Global Options:", "kplug:", "Fault
# injection (for tests only):"), or the usage line ("Usage: ...", argparse's "usage: ...").
SECTION = re.compile(r"^(?:([A-Za-z][^:]*):|([Uu]sage): (.*))$")
# An option entry starts at a small indentation with a dash; its description follows on the same line after two
# spaces or more, or on the more indented lines below.
OPTION = re.compile(r"^ {1,6}(-\S.*?)(?: {2,}(\S.*))?$")
COMMAND = re.compile(r"^ {1,6}(\S+) {2,}(\S.*)$")


@dataclass(frozen=True)
class Usage:
    """One command line to document: the subcommand's words after the program, and a sentence to put before it."""

    words: list[str]
    note: str


def help_text(program: str, arguments: list[str]) -> str:
    """``program arguments --help`` as a fresh shell prints it: 100 columns, no ``KPLUG_*`` or ``KUBECONFIG`` set
    (clap shows an environment variable's value when it is set)."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "100", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    done = subprocess.run([program, *arguments, "--help"], capture_output=True, text=True, env=environment, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{program} {' '.join(arguments)} --help exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def _cell(text: str) -> str:
    return _prose(text).replace("|", "\\|")


def _prose(text: str) -> str:
    """Help text as Markdown prose: one line, and ``<NAME>`` outside code spans escaped, not read as HTML."""
    parts = " ".join(text.split()).split("`")
    return "`".join(part if i % 2 else html.escape(part, quote=False) for i, part in enumerate(parts))


def _entries(lines: list[str], entry: re.Pattern[str]) -> list[tuple[str, str]]:
    """(name, description) of each entry, continuation lines joined."""
    found: list[tuple[str, list[str]]] = []
    for line in lines:
        if match := entry.match(line):
            found.append((match.group(1).strip(), [match.group(2) or ""]))
        elif line.strip() and found:
            found[-1][1].append(line.strip())
    return [(name, " ".join(part for part in description if part)) for name, description in found]


def markdown(text: str) -> str:
    """The help text as Markdown: its description, the usage, a table per option section, the subcommands and the
    examples."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in text.rstrip().splitlines():
        if match := SECTION.match(line):
            sections.append((match.group(1) or match.group(2), [match.group(3)] if match.group(3) else []))
        else:
            sections[-1][1].append(line.rstrip())
    out: list[str] = []
    for name, lines in sections:
        body = "\n".join(lines).strip("\n")
        if not body:
            continue
        title = name.lower()
        if title == "":
            out.append(_prose(body) + "\n")
        elif title == "usage":
            out.append("```text\n" + "\n".join(line.strip() for line in body.splitlines()) + "\n```\n")
        elif title == "examples":
            out.append("Examples:\n\n```sh\n" + _dedent(body) + "\n```\n")
        elif "commands" in title:
            rows = [f"| `{command}` | {_cell(what)} |" for command, what in _entries(lines, COMMAND) if command != "help"]
            out.append("| command | what |\n|---|---|\n" + "\n".join(rows) + "\n")
        else:
            entries = _entries(lines, OPTION)
            if not entries:
                out.append(_prose(body) + "\n")
                continue
            rows = [f"| `{flag}` | {_cell(what)} |" for flag, what in entries]
            heading = "Options" if title == "options" else name
            out.append(f"{heading}:\n\n| flag | what |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


def _dedent(body: str) -> str:
    lines = body.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def usage_page(
    program: str, usages: list[Usage], heading: str = "", prefix: list[str] | None = None, name: str = ""
) -> str:
    """A section per usage: its command line (``name``, else the program's file name) as a heading, the note, and
    the help read into Markdown."""
    name = name or os.path.basename(prefix[-1] if prefix else program)
    documented = {tuple(usage.words) for usage in usages}
    parts = [f"{heading}\n\n"] if heading else []
    for usage in usages:
        level = "###" if heading else "##"
        parts.append(f"{level} `{' '.join([name, *usage.words])}`\n\n")
        if usage.note:
            parts.append(f"{usage.note}\n\n")
        text = help_text(program, [*(prefix or []), *usage.words])
        undocumented = [command for command in subcommands(text) if (*usage.words, command) not in documented]
        if undocumented:
            raise RuntimeError(f"{name} {' '.join(usage.words)}: subcommands {undocumented} have no Usage in hack/docs/reference.py")
        parts.append(markdown(text) + "\n")
    return "".join(parts)


def subcommands(text: str) -> list[str]:
    """The subcommands a help text lists (clap's "Commands:", kubectl's "Available Commands:"), help aside."""
    listed: list[str] = []
    in_commands = False
    for line in text.splitlines():
        if match := SECTION.match(line):
            in_commands = "commands" in (match.group(1) or "").lower()
        elif in_commands and (match := COMMAND.match(line)) and match.group(1) != "help":
            listed.append(match.group(1))
    return listed
