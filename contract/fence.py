"""The lease as a fence on every control write, in one Redis round trip.

An executor writes the namespace's control state (swap phases, routing plans, the service state,
graph records, progress reports) only while it holds the lease and the namespace record exists.
A fenced write is one Lua script, which Redis runs atomically: it checks the lease token and the
namespace record, then the write's compare-and-set preconditions (for example "this swap record is
still exactly what I read"), and only then applies the write's commands. A lease taken over, a Redis
flushed, or a record changed by another writer since it was read therefore stops the whole write:
an executor that stalled past its lease (a GC pause, SIGSTOP, a network partition) cannot write when
it wakes up, and one whose Redis lost its data cannot rebuild the namespace from nothing.

Every key a script touches carries the namespace's hash tag (contract/names.py), so a Redis Cluster
keeps them in one slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from hotswap.contract.errors import ControlStateLost, LeaseLost
from hotswap.contract.names import Keys

OUTAGE_S = 60.0  # how long a control write waits for Redis to come back

# KEYS[1] the lease, KEYS[2] the namespace record, then every key the write names.
# ARGV[1] the writer's lease token ('' for an operator's client: no fence), ARGV[2] the number of
# preconditions, then 4 values each (kind, key index, hash field, value), then the number of
# commands, then for each: the command, its key index, its argument count, its arguments.
# Returns {0} written, {1, holder} lease lost, {2} namespace record missing, {3, n} precondition n
# failed (nothing written in any of these cases).
_FENCED_WRITE = """
local unpack = unpack or table.unpack
local token = ARGV[1]
if token ~= '' then
  if redis.call('exists', KEYS[2]) == 0 then
    return {2}
  end
  local holder = redis.call('get', KEYS[1])
  if holder ~= token then
    return {1, holder or ''}
  end
end
local i = 3
local n = tonumber(ARGV[2])
for c = 1, n do
  local kind, key, fld, value = ARGV[i], KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2], ARGV[i + 3]
  i = i + 4
  local found
  if fld == '' then
    found = redis.call('get', key)
  else
    found = redis.call('hget', key, fld)
  end
  if kind == 'absent' then
    if found then
      return {3, c}
    end
  elseif found ~= value then
    return {3, c}
  end
end
local m = tonumber(ARGV[i])
i = i + 1
for c = 1, m do
  local command, key, count = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  redis.call(command, key, unpack(ARGV, i + 3, i + 2 + count))
  i = i + 3 + count
end
return {0}
"""

_COMMANDS = frozenset({"set", "del", "incr", "hset", "hdel", "hincrby", "rpush", "lrem", "pexpire"})


class Batch:
    """The commands of one fenced write, with the preconditions it needs. Its methods are named
    (and take their arguments) as the Redis commands they queue."""

    def __init__(self) -> None:
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._preconditions: list[tuple[str, int, str, str]] = []
        self._commands: list[tuple[str, int, tuple[str, ...]]] = []

    def __bool__(self) -> bool:
        return bool(self._commands or self._preconditions)

    def _key(self, key: str) -> int:
        if key not in self._index:
            self._keys.append(key)
            self._index[key] = len(self._keys) + 2  # after the lease and the namespace record
        return self._index[key]

    # -- preconditions ---------------------------------------------------------------------
    def expect(self, key: str, value: bytes | str | None, *, field: str | None = None) -> Batch:
        """Write only if `key` (or its hash `field`) holds exactly `value` (None: does not exist)."""
        kind = "absent" if value is None else "equal"
        self._preconditions.append((kind, self._key(key), field or "", _text(value) or ""))
        return self

    # -- commands --------------------------------------------------------------------------
    def _queue(self, command: str, key: str, *args: Any) -> Batch:
        assert command in _COMMANDS, command
        self._commands.append((command, self._key(key), tuple(_text(a) or "" for a in args)))
        return self

    def set(self, key: str, value: bytes | str) -> Batch:
        return self._queue("set", key, value)

    def delete(self, key: str) -> Batch:
        return self._queue("del", key)

    def incr(self, key: str) -> Batch:
        return self._queue("incr", key)

    def hset(self, key: str, field: str, value: bytes | str) -> Batch:
        return self._queue("hset", key, field, value)

    def hdel(self, key: str, field: str) -> Batch:
        return self._queue("hdel", key, field)

    def hincrby(self, key: str, field: str, amount: int) -> Batch:
        return self._queue("hincrby", key, field, str(amount))

    def rpush(self, key: str, *values: str) -> Batch:
        return self._queue("rpush", key, *values)

    def lrem(self, key: str, count: int, value: str) -> Batch:
        return self._queue("lrem", key, str(count), value)

    def script_args(self, fence: Fence | None) -> tuple[list[str], list[str]]:
        # Without a fence the lease and namespace record are not read; the first key stands in for
        # them, so that every key the script is given stays in the namespace's slot.
        fixed = [fence.keys.lease, fence.keys.namespace_record] if fence else [self._keys[0]] * 2
        args = [fence.token if fence else "", str(len(self._preconditions))]
        for kind, key, fld, value in self._preconditions:
            args += [kind, str(key), fld, value]
        args.append(str(len(self._commands)))
        for command, key, values in self._commands:
            args += [command, str(key), str(len(values)), *values]
        return [*fixed, *self._keys], args


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


@dataclass(frozen=True)
class Fence:
    keys: Keys
    token: str

    def verify(self, reader: redis.Redis) -> None:
        """Raise unless this writer holds the lease and the namespace record exists (a read: the
        executor's tick checks this first, so a lost lease stops it even when it writes nothing)."""
        holder, record = reader.mget([self.keys.lease, self.keys.namespace_record])
        if record is None:
            raise self.control_state_lost()
        if _text(holder) != self.token:
            raise self.lease_lost(_text(holder))

    def control_state_lost(self) -> ControlStateLost:
        return ControlStateLost(
            f"the control state of namespace {self.keys.namespace!r} vanished from Redis (flushed, or an empty "
            "Redis took its place); stopping without writing. Nothing is lost in Kafka: see docs/guarantees.md, "
            "'Lost control state', to start the namespace over with `hotswap run --reset-namespace`"
        )

    def lease_lost(self, holder: str | None) -> LeaseLost:
        return LeaseLost(
            f"this executor lost its lease on namespace {self.keys.namespace!r} to {holder or 'nobody'} "
            "(it stalled longer than the lease TTL); stopping without writing"
        )


def write(client: redis.Redis, fence: Fence | None, batch: Batch) -> bool:
    """Apply `batch` atomically in one round trip: True once written, False if one of its
    preconditions failed (nothing was written; the caller reads again and decides again).

    Without a fence (an operator's client) only the preconditions are checked. A Redis that is
    restarting is waited for, up to OUTAGE_S, as the client's own retries wait for plain commands.
    """
    if not batch:
        return True
    script = client.register_script(_FENCED_WRITE)
    script_keys, args = batch.script_args(fence)
    deadline = time.monotonic() + OUTAGE_S
    pause = 0.1
    while True:
        try:
            outcome = script(keys=script_keys, args=args, client=client)
            break
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
    code = int(outcome[0])
    if code == 0:
        return True
    if code == 3:
        return False
    assert fence is not None
    if code == 2:
        raise fence.control_state_lost()
    raise fence.lease_lost(_text(outcome[1]) or None)


def fenced_write(client: redis.Redis, fence: Fence | None, queue: Callable[[Batch], object]) -> None:
    """Apply the commands `queue` adds to a batch as one fenced write, without preconditions."""
    batch = Batch()
    queue(batch)
    write(client, fence, batch)
