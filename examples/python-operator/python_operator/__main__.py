"""``python -m python_operator``: run the operator until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from python_operator import __version__
from python_operator.operator import Operator, Resource, connect, log


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="kplug-python-operator",
        description="Watch a custom resource and delegate each reconcile to a kplug plugin.",
    )
    parser.add_argument("--group", required=True, help="the custom resource's API group, e.g. myorg.org")
    parser.add_argument("--version", required=True, help="its version, e.g. v1alpha1")
    parser.add_argument("--plural", required=True, help="its plural name, e.g. databasetables")
    parser.add_argument("--namespace", help="watch only this namespace (default: all namespaces)")
    parser.add_argument("--kubeconfig", help="default: in-cluster, else $KUBECONFIG, else ~/.kube/config")
    parser.add_argument("--field-manager", default="kplug-python-operator", help="for patches and Events")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)

    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    resource = Resource(args.group, args.version, args.plural)
    operator = Operator(connect(args.kubeconfig), resource, args.namespace, args.field_manager)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: operator.stop())
    scope = f"namespace {args.namespace}" if args.namespace else "all namespaces"
    log.info("kplug-python-operator %s for %s/%s in %s", __version__, resource, resource.version, scope)
    operator.run()
    log.info("stopped")


if __name__ == "__main__":
    main()
