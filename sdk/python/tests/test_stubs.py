"""The committed gRPC stubs are exactly what the .proto contract generates."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parent.parent
COMMITTED = SDK / "src" / "kplug" / "_proto"


def contents(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    pinned = re.search(r'"grpcio-tools==([^"]+)"', (SDK / "pyproject.toml").read_text())
    assert pinned, "pyproject.toml must pin grpcio-tools"
    installed = importlib.metadata.version("grpcio-tools")
    assert installed == pinned[1], (
        f"grpcio-tools {installed} is installed but the stubs are generated with {pinned[1]}: run hack/python-env.sh"
    )

    generated = tmp_path / "_proto"
    subprocess.run(
        [sys.executable, str(SDK / "tools" / "generate_protos.py"), "--out", str(generated)],
        check=True,
        timeout=60,
    )
    fresh, committed = contents(generated), contents(COMMITTED)
    assert "kplug/v1alpha1/plugin_pb2.py" in fresh
    assert "kplug/v1alpha1/registry_pb2_grpc.py" in fresh
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"stubs out of date with proto/: {stale}; run sdk/python/generate.sh"


def test_stubs_import_from_inside_the_package() -> None:
    from kplug.proto import plugin_pb2_grpc, registry_pb2_grpc

    assert callable(plugin_pb2_grpc.PluginStub) and callable(registry_pb2_grpc.RegistryStub)
    source = (COMMITTED / "kplug" / "v1alpha1" / "plugin_pb2_grpc.py").read_text()
    assert "from . import plugin_pb2" in source
    assert "from kplug.v1alpha1" not in source
