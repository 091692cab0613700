"""The executor's lease on a namespace: only one executor acts at a time.

The holder keeps a random token in the lease key with a time-to-live and renews it every loop;
renewal and release only succeed while the key still holds our token (a fencing check).
"""

from __future__ import annotations

import os
import socket
import uuid

import redis

from executor.errors import LeaseHeld

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class Lease:
    def __init__(self, client: redis.Redis, key: str, ttl_ms: int = 15_000) -> None:
        self._redis = client
        self._key = key
        self._ttl_ms = ttl_ms
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def acquire(self) -> None:
        if self._redis.set(self._key, self.token, nx=True, px=self._ttl_ms):
            return
        holder = self._redis.get(self._key)
        holder_text = holder.decode() if isinstance(holder, bytes) else str(holder)
        raise LeaseHeld(
            f"another executor ({holder_text}) already runs this namespace; stop it first, "
            f"or wait {self._ttl_ms // 1000}s if it was killed"
        )

    def renew(self) -> None:
        if not self._redis.eval(_RENEW, 1, self._key, self.token, str(self._ttl_ms)):
            raise LeaseHeld("this executor lost its lease on the namespace (another executor took over); stopping")

    def release(self) -> None:
        self._redis.eval(_RELEASE, 1, self._key, self.token)
