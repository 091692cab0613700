"""Observed aggregates as one column (contract.observed)."""

from __future__ import annotations

import pytest
from pyspark.sql import Row

from hotswap.contract.observed import OBSERVED, observed_column, observed_values
from hotswap.execution_graph.closing import HeaderWatch


def test_observed_aggregates_travel_as_one_column_and_come_back_by_name() -> None:
    column = observed_column(["max(offset) AS max_offset_0", "sum(CASE WHEN x THEN 1 ELSE 0 END) AS `dead:bad json`"])
    assert column == (
        "named_struct('max_offset_0', max(offset), 'dead:bad json', sum(CASE WHEN x THEN 1 ELSE 0 END)) AS observed"
    )
    assert observed_values({OBSERVED: Row(max_offset_0=7, n=None)}) == {"max_offset_0": 7, "n": None}
    assert observed_values({}) is None


def test_an_aggregate_without_its_name_is_refused() -> None:
    with pytest.raises(ValueError, match="AS <name>"):
        observed_column(["max(offset)"])


def test_a_header_watch_of_two_partitions_and_two_buckets_is_one_column_of_twelve_fields() -> None:
    column = observed_column(HeaderWatch({0: (0, 9), 1: (4, 8)}, (0, 10_000), 10_000).aggregates())
    assert column.startswith("named_struct('rows_0', count(")
    assert column.endswith(") AS observed")
    assert column.count("', ") == 12
    assert "spark_partition_id" not in column, "a batch constant inside the struct is refused by Spark"
