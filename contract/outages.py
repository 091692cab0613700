"""An outage in two lines: one warning when a dependency (Kafka, Redis) goes away, saying what is
retried and for how long, and one info line when it is back.

Every part of the executor that retries a dependency reports here (the control loop, the transient
retries, the lease's heartbeat, the marker writer); the retries themselves, and the client
libraries' own connection chatter, go to the debug log (executor/logs.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

KAFKA = "Kafka"
REDIS = "Redis"
SETTLE_S = 1.0
# A dependency that fails again this soon after it was said to be back is the same outage ending
# unevenly (seen: a broker back up answers metadata, then refuses a produce with NodeNotReadyError
# while it registers): it is said again only if it stays away this long.
FLAP_S = 10.0


class Outages:
    """Which dependencies are unreachable now, since when; says so once each way."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}
        self._back_at: dict[str, float] = {}  # when each was last said to be reachable again
        self._unsaid: set[str] = set()  # down again right after it was back: not said (yet)

    def down(self, dependency: str, error: str, retrying: str, began: float | None = None) -> None:
        """`dependency` failed a call; `retrying` says what is retried, and for how long. `began`:
        when the failed call began (the clock's time), if it can wait long: a call that began before
        the dependency was back failed in the outage that ended, however late its timeout came."""
        now = self._clock()
        with self._lock:
            first = dependency not in self._since
            if first:
                self._since[dependency] = now
                asked = now if began is None else min(began, now)
                if asked - self._back_at.get(dependency, -FLAP_S) < FLAP_S:
                    self._unsaid.add(dependency)
            say = dependency not in self._unsaid and first
            if dependency in self._unsaid and now - self._since[dependency] >= FLAP_S:
                self._unsaid.discard(dependency)  # not a flap after all: it stays away
                say = True
        if say:
            log.warning(f"{dependency} unreachable; retrying", error=error, retrying=retrying)
        else:
            log.debug(f"{dependency} still unreachable", error=error, retrying=retrying)

    def up(self, dependency: str) -> None:
        """A call to `dependency` succeeded. Within SETTLE_S of the first failure, a success does not
        end the outage: it may be a call that began before the dependency went away, finishing on
        another thread (seen: "unreachable", "reachable again" and "unreachable" in one second)."""
        now = self._clock()
        with self._lock:
            since = self._since.get(dependency)
            if since is None or now - since < SETTLE_S:
                return
            del self._since[dependency]
            unsaid = dependency in self._unsaid
            self._unsaid.discard(dependency)
            if not unsaid:
                self._back_at[dependency] = now
        if unsaid:
            log.debug(f"{dependency} reachable again, after a brief relapse", down_s=round(now - since, 1))
        else:
            log.info(f"{dependency} reachable again", down_s=round(now - since, 1))

    def is_down(self, dependency: str) -> bool:
        with self._lock:
            return dependency in self._since


# One record per process: every client of a dependency reports to the same one.
OUTAGES = Outages()
