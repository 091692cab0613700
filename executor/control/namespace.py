"""A namespace's record in Redis, and what exists of it elsewhere: checkpoints and topics.

The record is written when the namespace's first executor starts. A namespace whose checkpoints
or topics exist but whose record does not has lost its control state (Redis was flushed, or an
empty Redis took its place). Starting over from nothing would reset the watermark, forget the
swaps and reuse query ids whose old checkpoints still exist, so the executor refuses, and
`hotswap run --reset-namespace` is the one way forward.

A Redis that lost only some acknowledged writes (restored from an older snapshot, a failover to a
replica that lagged) still has a record. So the journal's version (its count of writes) is also kept
beside the checkpoints (`JournalSeen`), and an executor refuses a Redis whose journal is older than
what the checkpoints have seen: a recorded cut it lost could otherwise be decided again.
"""

from __future__ import annotations

import time

import redis
import structlog

from hotswap.contract.errors import ControlStateLost, LeaseLost, TimeoutExpired
from hotswap.contract.models import NamespaceRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import ControlSettings
from hotswap.contract.source import SourceSpec
from hotswap.execution_graph.checkpoint import RootFiles
from hotswap.executor.control.topics import Topics

log = structlog.get_logger(__name__)

RESET_TIMEOUT_S = 60.0


def leftovers(control: ControlSettings, topics: Topics | None, checkpoints: RootFiles) -> list[str]:
    """What of the namespace exists outside Redis, in words (its topics only if `topics` is given)."""
    found = []
    if checkpoints.holds_anything():
        found.append(f"checkpoints in {checkpoints.where}")
    if topics is None:
        return found
    owned = topics.names(control.names.owned_topic_prefix)
    graphs = [t for t in owned if t.startswith(control.names.graph_topic(""))]
    if graphs:
        found.append(f"{len(graphs)} graph topic(s) such as {graphs[0]}")
    return found


def has_control_state(client: redis.Redis, keys: Keys) -> bool:
    return bool(client.exists(keys.current, keys.graphs, keys.swaps, keys.service))


class JournalSeen:
    """The highest journal version this namespace's executors have seen, in a file beside the
    checkpoints (written whole or not at all: see RootFiles.replace)."""

    FILE = "journal-version"

    def __init__(self, checkpoints: RootFiles) -> None:
        self._files = checkpoints
        self._written: int | None = None

    def read(self) -> int | None:
        where = f"{self._files.where}/{self.FILE}"
        try:
            text = self._files.read_text(self.FILE)
            return None if text is None else int(text.strip())
        except (OSError, ValueError) as exc:
            raise ControlStateLost(
                f"{where} cannot be read ({exc}); restore it, or delete it to skip this check once"
            ) from exc

    def note(self, version: int) -> None:
        """Record `version` if it is higher than the last one written (one small write per change)."""
        if self._written is not None and version <= self._written:
            return
        self._files.replace(self.FILE, f"{version}\n")
        self._written = version

    def check(self, client: redis.Redis, keys: Keys) -> None:
        """Refuse a Redis whose journal is older than what the checkpoints have seen."""
        seen = self.read()
        held = int(client.get(keys.journal_version) or 0)
        if seen is not None and held < seen:
            raise ControlStateLost(
                f"Redis holds version {held} of namespace {keys.namespace!r}'s swap journal, but its checkpoints "
                f"have seen version {seen}: Redis lost acknowledged writes (restored from an older snapshot, or a "
                "failover to a replica that lagged); nothing was started. Bring back the Redis that has them, or "
                "start over with `hotswap run --reset-namespace --query FILE`"
            )
        self._written = held


def claim(
    client: redis.Redis,
    control: ControlSettings,
    topics: Topics,
    checkpoints: RootFiles,
    holder: str,
    source: SourceSpec,
) -> None:
    """Make sure the namespace has its record (a new namespace's records how it reads `source`), or
    refuse to start if its control state was lost."""
    if refuse_lost_state(client, control, topics, checkpoints):
        return
    record = NamespaceRecord(created_by=holder, source=source)
    client.set(Keys(control.namespace).namespace_record, record.model_dump_json(), nx=True)


def refuse_lost_state(
    client: redis.Redis, control: ControlSettings, topics: Topics | None, checkpoints: RootFiles
) -> bool:
    """Raise ControlStateLost if the namespace lost its control state; returns whether it has its
    record (False: a new namespace). Reads only: `hotswap run` asks it before Spark starts, without
    `topics` (Kafka is not asked then), and the executor again, with them, before it claims."""
    keys = Keys(control.namespace)
    if client.exists(keys.namespace_record):
        JournalSeen(checkpoints).check(client, keys)
        return True
    if has_control_state(client, keys):
        raise ControlStateLost(
            f"Redis holds control state for namespace {control.namespace!r} but not its record (a key was deleted, "
            "or Redis lost acknowledged writes); nothing was started. Bring back the Redis that has it, or start "
            "over with `hotswap run --reset-namespace --query FILE`"
        )
    found = leftovers(control, topics, checkpoints)
    if found:
        raise ControlStateLost(
            f"namespace {control.namespace!r} has {' and '.join(found)}, but Redis holds no control state for "
            "it (flushed, or an empty Redis); nothing was started. To start the namespace over from the source "
            "topic's first offset, run `hotswap run --reset-namespace --query FILE`"
        )
    return False


def reset(
    client: redis.Redis, control: ControlSettings, topics: Topics, checkpoints: RootFiles, lease_token: str
) -> list[str]:
    """Remove the namespace's Redis keys, checkpoints and owned topics (not the source or results
    topic), under the namespace's lease, which the caller holds (`lease_token`): the lease key stays,
    so no executor can start on the namespace until the caller releases it. Returns what was
    removed, in words."""
    keys = Keys(control.namespace)
    holder = client.get(keys.lease)
    if (holder.decode() if isinstance(holder, bytes) else holder) != lease_token:
        raise LeaseLost("the namespace's lease is not held by this reset; nothing was removed")
    removed = []
    lease_key = keys.lease.encode()
    redis_keys = [
        key
        for key in client.scan_iter(match=f"{keys.prefix}:*", count=500)
        if (key.encode() if isinstance(key, str) else key) != lease_key
    ]
    if redis_keys:
        client.delete(*redis_keys)
        removed.append(f"{len(redis_keys)} Redis key(s)")
    if checkpoints.holds_anything():
        checkpoints.remove_all()
        removed.append(f"checkpoints in {checkpoints.where}")
    owned = topics.names(control.names.owned_topic_prefix)
    for topic in owned:
        topics.delete(topic)
    if owned:
        # Kafka deletes topics in the background; one created again too soon would vanish with it.
        deadline = time.monotonic() + RESET_TIMEOUT_S
        while topics.names(control.names.owned_topic_prefix):
            if time.monotonic() >= deadline:
                raise TimeoutExpired(
                    f"Kafka did not finish deleting the topics {control.names.owned_topic_prefix}* within "
                    f"{RESET_TIMEOUT_S:.0f}s; run the reset again"
                )
            time.sleep(0.5)
        removed.append(f"{len(owned)} topic(s) {control.names.owned_topic_prefix}*")
    log.warning("namespace reset", namespace=control.namespace, removed=removed)
    return removed
