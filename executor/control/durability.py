"""Redis must keep what it acknowledged. "A recorded cut is never re-decided" holds only if Redis
never loses an acknowledged write: a Redis that fsyncs its append-only file once a second, or keeps
RDB snapshots only, can come back from a crash without the cut while the namespace's record
survives, and nothing would notice. So the executor reads Redis's persistence settings before it
runs, and refuses one that may lose writes unless the operator opts out (`redis_may_lose_writes`)."""

from __future__ import annotations

import redis
import structlog

from hotswap.contract.errors import ConfigError
from hotswap.contract.settings import ControlSettings

log = structlog.get_logger(__name__)

_OPT_OUT = (
    "set HOTSWAP_REDIS_MAY_LOSE_WRITES=true to run anyway, accepting that a Redis crash may lose a recorded cut "
    "and let a swap be decided twice"
)


def check_durability(client: redis.Redis, control: ControlSettings) -> None:
    """Raise ConfigError, in one line, if Redis may lose an acknowledged write."""
    if control.redis_may_lose_writes:
        return
    try:
        found = client.config_get("append*")
    except redis.ResponseError as exc:  # CONFIG not allowed to this ACL user, or not offered by the service
        raise ConfigError(
            f"cannot read Redis's persistence settings ({exc}); allow `CONFIG GET` to hotswap's user "
            f"(+config|get), or {_OPT_OUT}"
        ) from exc
    appendonly = str(found.get("appendonly", "no")).lower()
    fsync = str(found.get("appendfsync", "")).lower()
    if appendonly == "yes" and fsync == "always":
        return
    what = "no append-only file" if appendonly != "yes" else f"appendfsync {fsync}"
    raise ConfigError(
        f"Redis may lose acknowledged writes ({what}): run it with --appendonly yes --appendfsync always, or {_OPT_OUT}"
    )
