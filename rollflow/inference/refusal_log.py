"""``RefusalLog``: a WARNING per refused request, at most once per client per minute.

What it is: the log line a server writes when it refuses a request (400 bad input, 401 wrong key), with
a per-client rate limit, so a caller that sends garbage in a loop cannot flood the log. The first refusal
of a client in a window is logged; the next ones in the same window are counted and reported with the
next line that is logged (``... (3 more refusals of this client in the last 60 s not logged)``).
Memory is bounded: at most ``max_clients`` clients are remembered (the oldest are forgotten first).

``OncePerClientFilter`` applies the same window to records of a logger the server does not write itself
(aiohttp's own "Error handling request from <peer>" lines, each with a traceback, for every malformed
HTTP request): the record's first argument is the client.

What it is not: a request limiter (every request is still answered) or an audit log.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable


class RefusalLog:
    """Rate-limited WARNING lines keyed by client (e.g. the peer address)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        window_s: float = 60.0,
        max_clients: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.window_s = window_s
        self.max_clients = max_clients
        self.clock = clock
        self._lock = threading.Lock()
        # client -> (time of the last logged line, refusals not logged since)
        self._seen: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    def due(self, client: str) -> int | None:
        """None if ``client`` was let through less than ``window_s`` ago (counted); else how many of its
        refusals were held back since, and the window restarts now."""
        now = self.clock()
        with self._lock:
            last, quiet = self._seen.get(client, (None, 0))
            if last is not None and now - last < self.window_s:
                self._seen[client] = (last, quiet + 1)
                return None
            self._seen[client] = (now, 0)
            self._seen.move_to_end(client)
            while len(self._seen) > self.max_clients:
                self._seen.popitem(last=False)
        return quiet

    def refused(self, client: str, message: str, *, exc_info: BaseException | None = None) -> bool:
        """Log ``message`` for ``client`` unless it was logged less than ``window_s`` ago; True if logged.

        ``exc_info``: an unexpected error, logged with its traceback (still once per client per window).
        """
        quiet = self.due(client)
        if quiet is None:
            return False
        more = f" ({quiet} more refusals of this client in the last {self.window_s:.0f} s not logged)"
        self.logger.warning(
            "refused a request from %s: %s%s", client, message, more if quiet else "", exc_info=exc_info
        )
        return True


class OncePerClientFilter(logging.Filter):
    """A logging filter: a record passes at most once per ``window_s`` per client (its first argument)."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window = RefusalLog(logging.getLogger(__name__), window_s=window_s, clock=clock)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return self._window.due(str(args[0]) if args else "unknown") is not None
