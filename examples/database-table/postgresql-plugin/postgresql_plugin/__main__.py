"""``python -m postgresql_plugin``: serve the plugin until SIGTERM or Ctrl-C."""

import kplug

from postgresql_plugin.implementation import PostgreSqlPlugin


def main() -> None:
    kplug.run(PostgreSqlPlugin())


if __name__ == "__main__":
    main()
