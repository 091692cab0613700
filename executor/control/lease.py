"""The executor's lease on a namespace: only one executor acts at a time.

The holder keeps a random token in the lease key with a time-to-live. A heartbeat thread renews
it, so long steps (validating, deploying) cannot let it lapse; renewal and release only succeed
while the key still holds our token (a fencing check). A lost lease stops the executor.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
import structlog

from hotswap.contract.errors import LeaseLost
from hotswap.contract.outages import OUTAGES, REDIS
from hotswap.executor.errors import LeaseHeld

log = structlog.get_logger(__name__)

POLL_S = 0.5  # how often a waiting executor asks again whether the lease is free

# Renews our lease, or takes it back if it vanished (e.g. it expired while Redis was restarting);
# fails only if another executor holds it.
_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
if not holder then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def process_space() -> str:
    """Names the space our pids live in: this boot of this kernel and this pid namespace. Two
    containers may share a hostname but not this, so a pid is only compared within one space."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(path) if path.endswith("/pid") else Path(path).read_text().strip())
        except OSError:
            parts.append("?")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def holder_is_dead(holder: str | None) -> bool:
    """Whether a lease token (host:pid:nonce:space) names a process of this host and pid space
    that no longer runs.

    Anything else (another host or container, a live pid, an unreadable token) may still be
    alive: its lease is left to expire. A zombie has exited and only waits for its parent.
    """
    if holder is None:
        return False
    fields = holder.split(":")
    if len(fields) != 4 or fields[0] != socket.gethostname() or fields[3] != process_space():
        return False
    pid_text = fields[1]
    if not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, under another user
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class Lease:
    def __init__(
        self,
        client: redis.Redis,
        key: str,
        ttl_ms: int = 15_000,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._redis = client
        self._key = key
        self._ttl_ms = ttl_ms
        # The clock and sleep bound the waits for a held lease (tests move time by hand); the
        # lease's expiry itself is Redis's, and the heartbeat renews it in real time.
        self._clock = clock
        self._sleep = sleep
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:{process_space()}"
        self._stop = threading.Event()
        self._lost: str | None = None
        self._thread: threading.Thread | None = None
        # Counted by the heartbeat, read by the metrics (hotswap_lease_renewals_total and
        # hotswap_lease_renewal_failures_total): the lease's own record of its renewals.
        self.renewals = 0
        self.renewal_failures = 0

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lease, waiting up to `wait_s` for a previous holder's lease to expire. A holder
        that is provably dead (a process of this host that no longer runs) is taken over at once."""
        deadline = self._clock() + wait_s
        while not self._redis.set(self._key, self.token, nx=True, px=self._ttl_ms):
            if self._take_over_dead_holder():
                continue
            if self._clock() >= deadline:
                self._refuse()
            self._sleep(POLL_S)
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name="hotswap-lease", daemon=True)
        self._thread.start()

    def wait_until_free(self, wait_s: float = 0.0) -> None:
        """Fail fast, before any expensive start-up, if another executor holds the lease."""
        deadline = self._clock() + wait_s
        while self._redis.exists(self._key) and not holder_is_dead(self._holder()):
            if self._clock() >= deadline:
                self._refuse()
            self._sleep(POLL_S)

    def _holder(self) -> str | None:
        holder = self._redis.get(self._key)
        return holder.decode() if isinstance(holder, bytes) else holder

    def _take_over_dead_holder(self) -> bool:
        """Delete the lease if its holder is provably dead (and still the holder); True if deleted."""
        holder = self._holder()
        if holder is None or not holder_is_dead(holder):
            return False
        if self._redis.eval(_RELEASE, 1, self._key, holder):
            log.info("lease of a dead executor taken over", holder=holder)
            return True
        return False

    def _refuse(self) -> None:
        holder_text = str(self._holder())
        raise LeaseHeld(
            f"another executor ({holder_text}) already runs this namespace; stop it first, "
            f"or wait {self._ttl_ms // 1000}s if it was killed (or use --lease-wait)"
        )

    def check(self) -> None:
        """Raises LeaseLost if the heartbeat found the lease taken by someone else (the fence finds
        the same on the next write; this is the heartbeat's earlier word)."""
        if self._lost is not None:
            raise LeaseLost(self._lost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._redis.eval(_RELEASE, 1, self._key, self.token)

    def _heartbeat(self) -> None:
        interval_s = self._ttl_ms / 3000
        while not self._stop.wait(interval_s):
            try:
                if not self._redis.eval(_RENEW, 1, self._key, self.token, str(self._ttl_ms)):
                    self.renewal_failures += 1
                    self._lost = "this executor lost its lease on the namespace (another executor took over); stopping"
                    return
                self.renewals += 1
                OUTAGES.up(REDIS)
            except redis.RedisError as exc:
                # Redis may be restarting; keep trying until the lease would have expired anyway.
                self.renewal_failures += 1
                OUTAGES.down(REDIS, str(exc), f"the lease's renewal, every {interval_s:.0f}s")
