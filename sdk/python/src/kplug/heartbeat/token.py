"""The ServiceAccount token sent with every heartbeat, read afresh each time."""

from __future__ import annotations

import logging
import threading

_log = logging.getLogger(__name__)

#: Call metadata, as grpcio takes it.
Metadata = tuple[tuple[str, str], ...]


class TokenFile:
    """The ``authorization`` metadata from a token file; shared by the heartbeat sessions.

    The file is read on every call, as the kubelet rotates it. A missing or
    unusable file is logged once per distinct problem and the call goes out
    without a token, so kplug's refusal says what is wrong.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._problem: str | None = None

    def metadata(self) -> Metadata | None:
        """The ``authorization`` metadata, read afresh; ``None`` without a (usable) file."""
        if self.path is None:
            return None
        try:
            token, problem = read_token(self.path), None
        except (OSError, ValueError) as error:
            token, problem = None, str(error)
        with self._lock:
            previous, self._problem = self._problem, problem
        if problem is None:
            if previous is not None:
                _log.info("the token file %s is usable again", self.path)
            return (("authorization", f"Bearer {token}"),)
        if problem != previous:
            _log.warning(
                "cannot use the ServiceAccount token file %s (%s); sending without a token, "
                "which kplug in cluster mode refuses",
                self.path,
                problem,
            )
        else:
            _log.debug("heartbeating without a token: %s", problem)
        return None


def read_token(path: str) -> str:
    """The token in ``path``; raises :class:`OSError` or :class:`ValueError` when it is unusable."""
    with open(path, encoding="utf-8") as file:
        token = file.read().strip()
    if not token:
        raise ValueError("the file is empty")
    # grpcio refuses metadata values beyond printable ASCII.
    if not all(" " <= character <= "~" for character in token):
        raise ValueError("the token has characters a gRPC header cannot carry")
    return token
