"""A plugin run as a process by test_run.py.

Reconcile touches ``spec.startedFile`` (if given), sleeps ``spec.sleep``
seconds, waits until ``spec.releaseFile`` exists (if given, within the call's
time), touches ``spec.finishedFile`` (if given) and answers with the
``--greeting`` flag, a flag of its own. With ``spec.signalThread``, it
first sends SIGTERM to its own thread, as the kernel may deliver a signal to
any thread of the process.
"""

import argparse
import pathlib
import signal
import threading
import time

import kplug


class Sleepy(kplug.Plugin):
    """Naps on request."""

    name = "sleepy"
    api = "naps.example.com/v1"
    implementation = "Sleepy"
    version = "1.0.0"
    greeting = "hi"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--greeting", default=self.greeting, help="what reconcile answers")

    def configure(self, args: argparse.Namespace) -> None:
        if not args.greeting:
            raise ValueError("--greeting must not be empty")
        self.greeting = args.greeting

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        spec = request.spec
        if spec.get("signalThread"):
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        if "startedFile" in spec:
            pathlib.Path(spec["startedFile"]).touch()
        time.sleep(float(spec.get("sleep", 0)))
        if "releaseFile" in spec:
            release = pathlib.Path(spec["releaseFile"])
            while not release.exists():
                remaining = request.time_remaining()
                if remaining is not None and remaining <= 0:
                    return kplug.Outcome.failure("NotReleased", f"{release} did not appear in time")
                time.sleep(0.01)
        if "finishedFile" in spec:
            pathlib.Path(spec["finishedFile"]).touch()
        return kplug.Outcome.success("Slept", self.greeting)


if __name__ == "__main__":
    kplug.run(Sleepy())
