"""Observed aggregates as one column (contract.observed)."""

from __future__ import annotations

import pytest
from pyspark.sql import Row

from hotswap.contract.observed import OBSERVED, observed_column, observed_values


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
