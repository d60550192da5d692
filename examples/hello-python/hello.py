"""The smallest kplug plugin in Python: it greets objects and says goodbye to them.

    python hello.py --registry 127.0.0.1:50051 --listen 127.0.0.1:0

See ``python hello.py --help`` for the flags, which all have ``KPLUG_*``
environment variable fallbacks.
"""

import argparse
import logging
import os

import kplug

_log = logging.getLogger("hello")


class Hello(kplug.Plugin):
    """Greets greetings.example.com/v1 objects by name."""

    name = "hello-python"
    api = "greetings.example.com/v1"
    implementation = "Hello"
    version = "0.1.0"
    #: Set by ``--report-trace-id``.
    report_trace_id = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        # The example's own flags, as hello-rust has them; the SDK's come from kplug.run.
        parser.add_argument(
            "--api",
            default=os.environ.get("KPLUG_API", self.api),
            help="the custom resource served, as resource.group/version (env KPLUG_API; default: %(default)s)",
        )
        parser.add_argument(
            "--implementation",
            default=os.environ.get("KPLUG_IMPLEMENTATION", self.implementation),
            help="the implementation's name (env KPLUG_IMPLEMENTATION; default: %(default)s)",
        )

        parser.add_argument(
            "--report-trace-id",
            action="store_true",
            default=os.environ.get("KPLUG_REPORT_TRACE_ID", "") not in ("", "0", "false"),
            help="report each call's trace id in the object status (traceID); off by default, "
            "since a status that changes on every reconcile costs the operator a write",
        )

    def configure(self, args: argparse.Namespace) -> None:
        self.api = args.api
        self.implementation = args.implementation
        self.report_trace_id = args.report_trace_id

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        # Greeting changes nothing, so a dry run is answered the same way.
        greeting = f"hello, {request.name}"
        # Logged while the SDK handles the call, so the record carries
        # operation_id and trace_id (kplug.run's format prints them).
        _log.info("greeting %s", request.name)
        status = {"greeting": greeting}
        if self.report_trace_id and request.trace_id:
            status["traceID"] = request.trace_id
        return kplug.Outcome.success("Greeted", greeting, object_status=status)

    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Goodbye", f"goodbye, {request.name}")


if __name__ == "__main__":
    kplug.run(Hello())
