"""Fixtures: a real PostgreSQL server (hack/postgres.sh), a database per test, the plugin served over gRPC."""

from __future__ import annotations

import copy
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kplug
import psycopg
import pytest
import yaml
from kplug.testing import PluginClient
from psycopg import conninfo, sql

from postgresql_plugin import PostgreSqlPlugin

EXAMPLE = Path(__file__).resolve().parent.parent.parent
REPO = EXAMPLE.parent.parent
POSTGRES_SH = REPO / "hack" / "postgres.sh"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A private PostgreSQL server for the session; its superuser DSN."""
    # Not pytest's tmp_path: PostgreSQL runs as an unprivileged user when the
    # tests run as root, and cannot reach into pytest's private (0700) folders.
    directory = tempfile.mkdtemp(prefix="kplug-postgres-")
    try:
        started = subprocess.run(
            [str(POSTGRES_SH), "start", directory], capture_output=True, text=True, timeout=180, check=False
        )
        if started.returncode != 0:
            pytest.fail(f"hack/postgres.sh could not start PostgreSQL:\n{started.stderr}", pytrace=False)
        yield started.stdout.strip()
    finally:
        subprocess.run([str(POSTGRES_SH), "stop", directory], capture_output=True, timeout=180, check=False)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def dsn(postgres_server: str) -> Iterator[str]:
    """A fresh, empty database for one test."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield conninfo.make_conninfo(postgres_server, dbname=name)
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    """A connection to the test's database, for checking what the plugin did."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def serve_plugin() -> Iterator[Callable[[PostgreSqlPlugin], PluginClient]]:
    """Serves a plugin instance on a free port and returns a client for it."""
    servers: list[kplug.Server] = []
    clients: list[PluginClient] = []

    def start(plugin: PostgreSqlPlugin) -> PluginClient:
        server = kplug.serve(plugin, kplug.Config(registry=None, listen="127.0.0.1:0"))
        servers.append(server)
        clients.append(PluginClient(server.address))
        return clients[-1]

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


@pytest.fixture
def client(dsn: str, serve_plugin: Callable[[PostgreSqlPlugin], PluginClient]) -> PluginClient:
    """A client for the plugin, whose default database is the test's."""
    return serve_plugin(PostgreSqlPlugin(dsn=dsn))


@pytest.fixture
def walkthrough() -> dict[str, dict[str, Any]]:
    """The walkthrough's sample objects from users.yaml, by kind (fresh copies)."""
    with (EXAMPLE / "users.yaml").open() as file:
        return {obj["kind"]: copy.deepcopy(obj) for obj in yaml.safe_load_all(file) if obj}
