"""kplug's images, built by ``hack/images.sh`` from the Dockerfiles we ship
with no registry and no Docker engine: each carries the name the manifests
run, runs as uid:gid 65532:65532, runs its binary (``--help``) in a container
without network, and imports into a containerd.

The first test builds what is missing: from nothing, the base images take
about 1.5 minutes and the images about 10 on 2 cores; when nothing changed,
about a second. Needs root and buildah (``hack/images.sh`` installs
buildah and debootstrap with apt when missing); KPLUG_SKIP_IMAGES=1 skips
these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES_SH = REPO / "hack" / "images.sh"
CACHE = Path(os.environ.get("KPLUG_CACHE", Path.home() / ".cache" / "kplug")) / "images"
NONROOT = "65532:65532"
# A build from nothing, with the CPU shared: generous.
BUILD_TIMEOUT = int(os.environ.get("KPLUG_IMAGES_TIMEOUT", "3600"))

pytestmark = [
    pytest.mark.skipif(os.environ.get("KPLUG_SKIP_IMAGES") == "1", reason="KPLUG_SKIP_IMAGES=1"),
    pytest.mark.timeout(BUILD_TIMEOUT + 600),
]


def images_sh(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(IMAGES_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def run(*command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)


def shipped() -> dict[str, tuple[str, str]]:
    """NAME -> (reference, Dockerfile) of every image the script builds."""
    listed = images_sh("list", timeout=60)
    assert listed.returncode == 0, listed.stderr
    images = {}
    for line in listed.stdout.splitlines():
        name, ref, dockerfile = line.split()
        images[name] = (ref, dockerfile)
    return images


IMAGES = shipped()


def test_every_manifest_image_is_built() -> None:
    """Every image a shipped manifest runs is one the script builds, by the same name."""
    referenced = set()
    for manifest in [*REPO.glob("deploy/**/*.yaml"), *REPO.glob("examples/*/deploy/**/*.yaml")]:
        for line in manifest.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 2 and "image:" in words[:2]:
                referenced.add(words[-1])
    assert referenced == {ref for ref, _ in IMAGES.values()}


@pytest.fixture(scope="session")
def built() -> dict[str, tuple[str, str]]:
    """The images, built (or found up to date) by ``hack/images.sh build``."""
    if os.geteuid() != 0:
        pytest.fail("building images needs root (buildah's system storage, debootstrap); KPLUG_SKIP_IMAGES=1 skips")
    started = time.monotonic()
    result = images_sh("build", timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, f"hack/images.sh build failed:\n{result.stderr[-8000:]}"
    print(f"hack/images.sh build: {time.monotonic() - started:.0f}s\n{result.stderr}")
    return IMAGES


def inspect(ref: str) -> dict:
    result = run("buildah", "inspect", "--type", "image", ref)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_runs_as_nonroot_without_network(built: dict[str, tuple[str, str]], name: str) -> None:
    ref, _ = built[name]
    config = inspect(ref)["OCIv1"]["config"]
    assert config.get("User") == NONROOT, f"{ref} runs as {config.get('User')!r}"
    entrypoint = config.get("Entrypoint") or []
    assert entrypoint, f"{ref} has no entrypoint"

    container = run("buildah", "from", "--pull=never", "--quiet", ref).stdout.strip()
    assert container, f"buildah from {ref} failed"
    try:
        help_ = run("buildah", "run", "--network", "none", container, "--", *entrypoint, "--help")
        assert help_.returncode == 0, f"{' '.join(entrypoint)} --help failed in {ref}:\n{help_.stdout}{help_.stderr}"
        assert "usage" in help_.stdout.lower(), help_.stdout
    finally:
        run("buildah", "rm", container)

    # The script's check runs the same, plus a static probe that prints the
    # uid and gid the container's processes get (the images have no shell).
    check = images_sh("check", name)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(f"ok {name} {ref} uid=65532 gid=65532 help: "), check.stdout


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_archive_is_what_ctr_imports(built: dict[str, tuple[str, str]], name: str) -> None:
    """The docker-archive carries the manifests' name and the non-root user."""
    ref, _ = built[name]
    with tarfile.open(CACHE / "archives" / f"{name}.tar") as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        assert manifest["RepoTags"] == [ref]
        config = json.load(archive.extractfile(manifest["Config"]))
    assert config["config"]["User"] == NONROOT


def test_verify_refuses_root_and_named_users(built: dict[str, tuple[str, str]]) -> None:
    """What `build` checks of every image: a root or non-numeric user fails."""
    made = []
    try:
        for user in ("0:0", "nonroot", "65532:0"):
            container = run("buildah", "from", "--pull=never", "--quiet", "localhost/kplug-base/cc-nonroot").stdout.strip()
            assert container
            assert run("buildah", "config", "--user", user, container).returncode == 0
            ref = f"localhost/kplug-test/user-{user.replace(':', '-')}:latest"
            committed = run("buildah", "commit", "--quiet", "--rm", container, ref)
            assert committed.returncode == 0, committed.stderr
            made.append(ref)
            refused = images_sh("verify", ref)
            assert refused.returncode != 0, f"verify accepted {user}: {refused.stdout}"
            assert f"{ref} runs as" in refused.stderr, refused.stderr
        good = images_sh("verify", *(ref for ref, _ in built.values()))
        assert good.returncode == 0, good.stderr
    finally:
        for ref in made:
            run("buildah", "rmi", ref)


@pytest.fixture
def containerd() -> Iterator[str]:
    """A throwaway containerd (no CRI plugin), with its own root, state and
    socket under /tmp; stopped and removed afterwards. Yields its socket."""
    if not (shutil.which("containerd") and shutil.which("ctr")):
        pytest.skip("containerd is not installed (hack/cluster.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="kplug-ctrd-", dir="/tmp"))
    socket = work / "containerd.sock"
    (work / "config.toml").write_text(
        f"""version = 2
root = "{work}/root"
state = "{work}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{work}/opt"
""",
        encoding="utf-8",
    )
    with open(work / "containerd.log", "wb") as log:
        daemon = subprocess.Popen(["containerd", "--config", str(work / "config.toml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert daemon.poll() is None, (work / "containerd.log").read_text()
            assert time.monotonic() < deadline, "containerd did not start"
            time.sleep(0.1)
        yield str(socket)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(work, ignore_errors=True)


def test_load_imports_into_containerd(built: dict[str, tuple[str, str]], containerd: str) -> None:
    env = {"CONTAINERD_ADDRESS": containerd}
    loaded = images_sh("load", env=env)
    assert loaded.returncode == 0, loaded.stderr
    ready = subprocess.run(
        ["ctr", "--address", containerd, "-n", "k8s.io", "images", "check", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    # Fully present and unpacked: the kubelet can run them (IfNotPresent).
    assert sorted(ready) == sorted(ref for ref, _ in built.values())
    again = images_sh("load", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("already in containerd") == len(built), again.stderr


def test_build_again_is_a_no_op(built: dict[str, tuple[str, str]]) -> None:
    started = time.monotonic()
    result = images_sh("build")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("up to date") == len(built), result.stderr
    assert took < 30, f"an unchanged build took {took:.0f}s"
