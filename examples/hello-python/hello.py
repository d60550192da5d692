"""The smallest kplug plugin in Python: it greets objects and says goodbye to them.

    python hello.py --registry 127.0.0.1:50051 --listen 127.0.0.1:0

See ``python hello.py --help`` for the flags, which all have ``KPLUG_*``
environment variable fallbacks.
"""

import kplug


class Hello(kplug.Plugin):
    """Greets greetings.example.com/v1 objects by name."""

    name = "hello-python"
    api = "greetings.example.com/v1"
    implementation = "Hello"
    version = "0.1.0"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        # Greeting changes nothing, so a dry run is answered the same way.
        greeting = f"hello, {request.name}"
        return kplug.Outcome.success("Greeted", greeting, object_status={"greeting": greeting})

    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Goodbye", f"goodbye, {request.name}")


if __name__ == "__main__":
    kplug.run(Hello())
