import pytest

from hotswap.contract.errors import ConfigError
from hotswap.contract.windows import (
    Windowing,
    common_boundary_ms,
    cut_boundary,
    format_duration_ms,
    parse_duration_ms,
    reached_cut,
    window_end,
    window_start,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("10s", 10_000), ("500ms", 500), ("2m", 120_000), ("1 hour", 3_600_000), ("250", 250), ("30 seconds", 30_000)],
)
def test_durations_are_read_in_milliseconds(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["ten seconds", "10 parsecs", "", "-5s"])
def test_unreadable_durations_are_refused_with_a_hint(text: str) -> None:
    with pytest.raises(ConfigError, match="use a number and a unit"):
        parse_duration_ms(text)


def test_durations_format_back_to_their_largest_unit() -> None:
    assert [format_duration_ms(ms) for ms in (30_000, 120_000, 3_600_000, 1500)] == ["30s", "2m", "1h", "1500ms"]


def test_windows_are_aligned_to_the_epoch() -> None:
    assert window_start(1_700_000_012_345, 10_000) == 1_700_000_010_000
    assert window_end(1_700_000_012_345, 10_000) == 1_700_000_020_000
    # An event exactly on a boundary opens the next window.
    assert window_start(1_700_000_020_000, 10_000) == 1_700_000_020_000


def tumbling(size_ms: int) -> Windowing:
    return Windowing.of(size_ms)


def test_cut_rounds_up_to_a_boundary_shared_by_both_sizes() -> None:
    # From 10 s to 30 s windows, the cut falls on a multiple of 30 s at or after the largest window end.
    assert cut_boundary(1_700_000_020_000, tumbling(10_000), tumbling(30_000)) == 1_700_000_040_000
    assert cut_boundary(1_700_000_040_000, tumbling(10_000), tumbling(30_000)) == 1_700_000_040_000
    # 20 s and 30 s windows share a boundary every minute.
    assert common_boundary_ms(20_000, 30_000) == 60_000
    assert cut_boundary(1_700_000_020_000, tumbling(20_000), tumbling(30_000)) % 60_000 == 0


def test_cut_of_equal_sizes_is_the_current_window_end() -> None:
    assert cut_boundary(1_700_000_050_000, tumbling(10_000), tumbling(10_000)) == 1_700_000_050_000


def test_a_cut_is_reached_by_a_watermark_at_it_and_a_cut_at_zero_at_once() -> None:
    assert reached_cut(30_000, 30_000)
    assert not reached_cut(29_999, 30_000)
    assert not reached_cut(None, 30_000)
    assert reached_cut(None, 0)
