"""Typed reads of the shared records in Redis, so every room decodes them the same way."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from hotswap.contract.models import CurrentQuery, GraphProgress, GraphRecord, ServiceState
from hotswap.contract.names import Keys


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_graphs(client: redis.Redis, keys: Keys) -> dict[str, GraphRecord]:
    return {_text(k): GraphRecord.model_validate_json(v) for k, v in client.hgetall(keys.graphs).items()}


def read_graphs_named(client: redis.Redis, keys: Keys, query_ids: Iterable[str]) -> dict[str, GraphRecord]:
    """The records of these graphs only, in one round trip (missing ones left out)."""
    ids = list(dict.fromkeys(query_ids))
    if not ids:
        return {}
    raws = client.hmget(keys.graphs, ids)
    return {i: GraphRecord.model_validate_json(raw) for i, raw in zip(ids, raws, strict=True) if raw is not None}


def read_current(client: redis.Redis, keys: Keys) -> CurrentQuery | None:
    raw = client.get(keys.current)
    return None if raw is None else CurrentQuery.model_validate_json(raw)


def read_service_state(client: redis.Redis, keys: Keys) -> ServiceState:
    raw = client.get(keys.service)
    return ServiceState() if raw is None else ServiceState.model_validate_json(raw)


def read_counters(client: redis.Redis, keys: Keys) -> dict[str, int]:
    return {_text(k): int(v) for k, v in client.hgetall(keys.counters).items()}


def read_progress(client: redis.Redis, keys: Keys, query_id: str) -> GraphProgress | None:
    """The service sink's last report on one execution graph, or None before its first batch."""
    raw = client.get(keys.progress(query_id))
    return None if raw is None else GraphProgress.model_validate_json(raw)
