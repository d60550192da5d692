"""A small operator in Python that delegates its reconciles through kplug's
``reconciles`` API, with nothing but the official ``kubernetes`` client.

Run it with ``python -m python_operator --group G --version V --plural P``
(or the ``kplug-python-operator`` command); ``--help`` lists the flags.
"""

__version__ = "0.1.0"
