"""Generates the SDK's gRPC stubs from kplug's .proto contract.

Run through ``sdk/python/generate.sh``. The stubs are committed; the test
``tests/test_stubs.py`` regenerates them into a temporary folder and fails
when they differ, so they cannot drift from the contract.

protoc writes ``kplug/v1alpha1/*_pb2*.py`` with absolute imports such as
``from kplug.v1alpha1 import registry_pb2``, which inside this SDK would
resolve to the ``kplug`` package itself. They are rewritten as relative
imports, so the stubs work from ``kplug._proto.kplug.v1alpha1``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

SDK_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROTO_ROOT = SDK_ROOT.parent.parent / "proto"
DEFAULT_OUT = SDK_ROOT / "src" / "kplug" / "_proto"
PACKAGE = "kplug/v1alpha1"

# `from kplug.v1alpha1 import plugin_pb2 as ...` -> `from . import plugin_pb2 as ...`
ABSOLUTE_IMPORT = re.compile(r"^from kplug\.v1alpha1 import ", re.MULTILINE)

INIT_FILES = {
    "__init__.py": '"""Generated gRPC stubs. Regenerate with sdk/python/generate.sh; do not edit."""\n',
    "kplug/__init__.py": "",
    "kplug/v1alpha1/__init__.py": "",
}


def generate(out: Path, proto_root: Path = DEFAULT_PROTO_ROOT) -> list[Path]:
    """Writes the stubs for every ``.proto`` in ``kplug/v1alpha1`` under ``out``.

    ``out`` is replaced entirely. Returns the files written, relative to it.
    """
    protos = sorted(p.relative_to(proto_root).as_posix() for p in (proto_root / PACKAGE).glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files in {proto_root / PACKAGE}")
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch) / "out"
        (staged / PACKAGE).mkdir(parents=True)
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"--proto_path={proto_root}",
                f"--proto_path={well_known}",
                f"--python_out={staged}",
                f"--pyi_out={staged}",
                f"--grpc_python_out={staged}",
                *protos,
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status}")
        for generated in (staged / PACKAGE).iterdir():
            text = generated.read_text(encoding="utf-8")
            generated.write_text(ABSOLUTE_IMPORT.sub("from . import ", text), encoding="utf-8")
        for name, content in INIT_FILES.items():
            (staged / name).write_text(content, encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(staged, out)
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    """Command line: ``generate_protos.py [--out DIR] [--proto-root DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to (re)write; default: %(default)s")
    parser.add_argument("--proto-root", type=Path, default=DEFAULT_PROTO_ROOT, help="default: %(default)s")
    args = parser.parse_args(argv)
    generate(args.out, args.proto_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
