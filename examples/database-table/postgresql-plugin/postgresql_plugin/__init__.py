"""The kplug walkthrough's DatabaseTable plugin for PostgreSQL.

Run it with ``python -m postgresql_plugin --dsn postgresql://...`` (or the
``database-table-postgresql-plugin`` command); ``--help`` lists the flags.
"""

from postgresql_plugin._version import __version__
from postgresql_plugin.implementation import PostgreSqlPlugin

__all__ = ["PostgreSqlPlugin", "__version__"]
