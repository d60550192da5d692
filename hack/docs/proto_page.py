"""The gRPC reference from the ``.proto`` files: services, their RPCs, messages with their fields and enums, each
with the comment written above it in the file."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FIELD = re.compile(r"^(repeated |optional )?([\w.]+|map<[\w.]+, *[\w.]+>) (\w+) = (\d+);")
RPC = re.compile(r"^rpc (\w+)\((stream )?([\w.]+)\) returns \((stream )?([\w.]+)\);")
ENUM_VALUE = re.compile(r"^(\w+) = (-?\d+);")


@dataclass
class Block:
    """A service, message or enum: its comment, and its rows (name, type, number or signature, comment)."""

    keyword: str
    name: str
    comment: str
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[str, list[Block]]:
    """The file's own comment (above ``syntax``) and its top-level blocks, in order."""
    file_comment: list[str] = []
    pending: list[str] = []
    blocks: list[Block] = []
    stack: list[Block] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("//"):
            pending.append(line[2:].strip())
            continue
        if not line:
            continue
        comment, pending = " ".join(pending), []
        if line.startswith("syntax"):
            file_comment = comment.split(" ") if comment else []
            continue
        if match := re.match(r"^(service|message|enum) (\w+) \{$", line):
            block = Block(match.group(1), (f"{stack[-1].name}." if stack else "") + match.group(2), comment)
            blocks.append(block)
            stack.append(block)
            continue
        if line == "}":
            stack.pop()
            continue
        if not stack:
            continue
        current = stack[-1]
        if match := RPC.match(line):
            request = f"{'stream ' if match.group(2) else ''}{match.group(3)}"
            response = f"{'stream ' if match.group(4) else ''}{match.group(5)}"
            current.rows.append((match.group(1), request, response, comment))
        elif match := FIELD.match(line):
            label = (match.group(1) or "").strip()
            kind = f"{label} {match.group(2)}".strip()
            current.rows.append((match.group(3), kind, match.group(4), comment))
        elif match := ENUM_VALUE.match(line):
            current.rows.append((match.group(1), "", match.group(2), comment))
    return " ".join(file_comment), blocks


def grpc_page(files: list[Path], repo: Path) -> str:
    out = [
        "The contract between kplug and plugins. Plugins serve `Plugin`; they call `Registry` on kplug. The SDKs "
        "implement both sides' plumbing; a plugin without an SDK implements these directly.\n\n"
    ]
    for path in files:
        file_comment, blocks = parse(path.read_text())
        out.append(f"## `{path.relative_to(repo)}`\n\n")
        if file_comment:
            out.append(f"{_cell(file_comment)}\n\n")
        for block in blocks:
            out.append(f"### {block.keyword} `{block.name}`\n\n")
            if block.comment:
                out.append(f"{_cell(block.comment)}\n\n")
            if not block.rows:
                continue
            if block.keyword == "service":
                out.append("| RPC | request | response | |\n|---|---|---|---|\n")
            elif block.keyword == "message":
                out.append("| field | type | number | |\n|---|---|---:|---|\n")
            else:
                out.append("| value | | number | |\n|---|---|---:|---|\n")
            for name, kind, number, comment in block.rows:
                kind_cell = f"`{kind}`" if kind else ""
                out.append(f"| `{name}` | {kind_cell} | {number if block.keyword != 'service' else f'`{number}`'} | {_cell(comment)} |\n")
            out.append("\n")
    return "".join(out).rstrip("\n") + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
