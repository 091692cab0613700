"""A batch's numbers reach Spark in a form that leaves its generated code the same from batch to batch
(contract/batch_constants.py). The form is pinned here: a plain literal, or `java_method`, would bring
back a compilation per batch (or an interpreted stage) without failing any other test."""

from __future__ import annotations

from hotswap.contract.batch_constants import HIGHEST, LOWEST, batch_long, batch_timestamp

NEVER = "IF(spark_partition_id() < 0, CAST(NULL AS DECIMAL(18,0)), NULL)"


def test_a_number_is_a_decimal_behind_a_nondeterministic_null() -> None:
    assert batch_long(1_800_000_100_000) == f"CAST(coalesce({NEVER}, CAST(1800000100000 AS DECIMAL(18,0))) AS BIGINT)"


def test_numbers_past_what_a_decimal_18_holds_are_clamped_to_open_bounds() -> None:
    assert (LOWEST, HIGHEST) == (-(10**18 - 1), 10**18 - 1)
    assert batch_long(2**63 - 1) == batch_long(HIGHEST)
    assert batch_long(-(2**63)) == batch_long(LOWEST)
    assert f"CAST({HIGHEST} AS DECIMAL(18,0))" in batch_long(10**19)


def test_a_timestamp_is_the_same_number_under_timestamp_millis() -> None:
    assert batch_timestamp(1_800_000_000_000) == f"timestamp_millis({batch_long(1_800_000_000_000)})"


def test_two_numbers_differ_only_in_their_digits() -> None:
    # What makes Spark's generated code the same: the rest of the text is identical.
    one, seven = batch_long(1), batch_long(7)
    assert one.replace("1 AS DECIMAL", "N AS DECIMAL") == seven.replace("7 AS DECIMAL", "N AS DECIMAL")
