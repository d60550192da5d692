"""The plugin base class and what a plugin declares about itself."""

from __future__ import annotations

import abc
import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from kplug.types import Outcome, Request

# Kubernetes' DNS-1123 subdomain: what kplug accepts as a plugin's name.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_SUBDOMAIN_MAX = 253


@dataclass(frozen=True, slots=True)
class ApiRef:
    """A Kubernetes resource: ``resource.group/version``, e.g. ``databasetables.myorg.org/v1alpha1``."""

    group: str
    #: Plural resource name, e.g. ``databasetables``.
    resource: str
    version: str

    @classmethod
    def parse(cls, value: str) -> Self:
        """Parses ``resource.group/version``.

        Raises :class:`ValueError` naming the wrong part. A bare
        ``resource/version`` is refused: plugins reconcile custom resources,
        which always have a group.
        """
        qualified, slash, version = value.partition("/")
        resource, dot, group = qualified.partition(".")
        problem = None
        if not slash:
            problem = "missing /version"
        elif not dot:
            problem = "missing .group after the resource"
        elif not resource:
            problem = "empty resource"
        elif not group:
            problem = "empty group"
        elif not version or "/" in version:
            problem = "version must be one non-empty segment"
        if problem:
            raise ValueError(
                f"invalid API {value!r}: {problem}; expected resource.group/version, "
                "e.g. databasetables.myorg.org/v1alpha1"
            )
        return cls(group=group, resource=resource, version=version)

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}/{self.version}"


@dataclass(frozen=True, slots=True)
class Extension:
    """An extension kind a plugin understands, e.g. ``Extension("myorg.org", "DatabaseTablePostgreSqlExtension")``."""

    group: str
    kind: str
    #: A version of ``group``; empty means any.
    version: str = ""


class Plugin(abc.ABC):
    """Base class for plugins. Subclass it, set the class attributes, implement :meth:`reconcile`::

        class Hello(kplug.Plugin):
            name = "hello-python"
            api = "greetings.example.com/v1"
            implementation = "Hello"
            version = "0.1.0"

            def reconcile(self, request: kplug.Request) -> kplug.Outcome:
                return kplug.Outcome.success("Greeted", f"hello, {request.name}")

        if __name__ == "__main__":
            kplug.run(Hello())

    The SDK calls :meth:`reconcile` and :meth:`finalize` from a thread pool,
    so several calls may run at once: keep per-request state in locals and
    guard anything shared.
    """

    #: DNS-1123 subdomain; the Plugin object's name in kplug. ``--name`` overrides it.
    name: str = ""
    #: The custom resource reconciled, as ``resource.group/version``.
    api: str = ""
    #: The implementation's name, e.g. ``PostgreSQL``; kplug selects plugins by it.
    implementation: str = ""
    #: The plugin's own release, e.g. ``1.4.2``.
    version: str = ""
    #: Extension kinds the plugin understands.
    extensions: Sequence[Extension] = ()

    @abc.abstractmethod
    def reconcile(self, request: Request) -> Outcome:
        """Brings the world in line with ``request.object``'s spec.

        Must change nothing when ``request.dry_run`` is set, only report
        what it would do. Return :meth:`Outcome.failure` for failures the
        operator should see; an exception becomes a gRPC ``INTERNAL`` error.
        """

    def finalize(self, request: Request) -> Outcome:
        """Cleans up what ``request.object`` owns before it is deleted.

        The default owns nothing and succeeds. A plugin that keeps it
        declares no ``Finalize`` capability, so the operator puts no
        finalizer on its objects and their deletion waits for nobody (the
        operator still removes their children).
        """
        del request
        return Outcome.success()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Adds the plugin's own command-line flags to those of :func:`kplug.run`."""

    def configure(self, args: argparse.Namespace) -> None:
        """Receives the parsed command line before serving starts.

        Raise :class:`ValueError` to report a bad flag; :func:`kplug.run`
        then prints the usage and exits with status 2.
        """


def check_name(name: str) -> None:
    """Raises :class:`ValueError` unless ``name`` is a DNS-1123 subdomain, as kplug requires."""
    if len(name) > _DNS1123_SUBDOMAIN_MAX or not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise ValueError(
            f"invalid plugin name {name!r}: it must be a lowercase RFC 1123 subdomain "
            "(lowercase letters, digits, '-' and '.'; e.g. 'database-table-postgresql-plugin')"
        )
