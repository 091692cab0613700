"""Issue 8: one key per result, whatever the types of the group columns."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from pyspark.sql import SparkSession

from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec, produce
from tests.conftest import wait_until
from tests.integration.harness import QUERIES, committed_watermark, executor_running, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MANY_TYPES = QUERIES / "groups_of_many_types.sql"
GROUPS = ("parity", "half", "second", "tag")  # bigint, double, timestamp, string (null for k0)
T0 = 1_700_000_000_000


def test_groups_of_bigint_double_and_timestamp_columns_never_share_a_result_key(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    # 2000 events, one every 10 ms of event time: 20 s, so the windows of T0 and T0 + 10 s close.
    spec = GeneratorSpec(rate=2000, keys=3, seed=17, count=2000, time_scale=20, start_ts=T0)
    with executor_running(settings, spark, MANY_TYPES):
        produce(settings.kafka, spec, settings.source_topic)
        query_id = MANY_TYPES.stem
        wait_until(lambda: committed_watermark(client, query_id) >= T0 + 10_000, 120, "the first window to close")
    records = read_topic(settings, settings.sink_topic)

    groups_by_key: dict[bytes, set[tuple[Any, ...]]] = defaultdict(set)
    for record in records:
        assert record.key is not None
        body = json.loads(record.value)
        key = json.loads(record.key)
        # Compact, the window start first and then every group column in output order.
        assert list(key) == ["window_start", *GROUPS]
        assert record.key == json.dumps(key, separators=(",", ":")).encode()
        assert key == {"window_start": body["window_start"], **{c: body.get(c) for c in GROUPS}}
        groups_by_key[record.key].add((body["window_start"], *(body.get(c) for c in GROUPS)))

    identities = {identity for groups in groups_by_key.values() for identity in groups}
    assert all(len(groups) == 1 for groups in groups_by_key.values()), "two groups share a result key"
    assert len(groups_by_key) == len(identities) == len(records), "each group is written once, under its own key"
    # Every group column varies within a window, so a key that left any of them out would collide.
    first_window = min(identity[0] for identity in identities)
    in_first = [identity for identity in identities if identity[0] == first_window]
    for position in range(1, len(GROUPS) + 1):
        assert len({identity[position] for identity in in_first}) > 1, f"{GROUPS[position - 1]} does not vary"
    # A null group and the string "null" are two groups with two keys.
    tags = {json.loads(key)["tag"] for key in groups_by_key}
    assert {None, "null", "k2"} <= tags
