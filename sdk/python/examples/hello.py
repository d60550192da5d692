# The plugin of the book's "Write a plugin in Python" page, which includes this file: the docs' tests run it against
# kplug, so the page cannot show code that does not run or answer as it says.
# ANCHOR: plugin
import kplug


class Hello(kplug.Plugin):
    name = "hello-python"
    api = "greetings.example.com/v1"
    implementation = "Hello"
    version = "0.1.0"

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        greeting = f"hello, {request.name}"
        return kplug.Outcome.success("Greeted", greeting, object_status={"greeting": greeting})

    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        return kplug.Outcome.success("Goodbye", f"goodbye, {request.name}")


if __name__ == "__main__":
    kplug.run(Hello())
# ANCHOR_END: plugin
