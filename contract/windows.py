"""Window arithmetic shared by the executor and the service graph.

Windows are tumbling and aligned to the Unix epoch, as Spark's `window()` builds them without a
start offset: the window of event time t (ms) with size s is [floor(t/s)*s, floor(t/s)*s + s).
"""

from __future__ import annotations

import math
import re

from hotswap.contract.errors import ConfigError

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
}
# Execution graphs watermark their input with a delay so large that no data row can move Spark's
# watermark. Only the service graph's watermark markers do: a marker whose event time is
# `watermark + GRAPH_WATERMARK_DELAY_MS` sets Spark's watermark to exactly `watermark`, so every
# execution graph closes windows on the service watermark (docs/architecture.md, "One watermark").
GRAPH_WATERMARK_DELAY_MS = 100 * 365 * 86_400_000  # 100 years
# The latest event time hotswap accepts: a marker for it must still be a valid timestamp.
MAX_EVENT_TIME_MS = 253_402_300_799_999 - GRAPH_WATERMARK_DELAY_MS  # 9999-12-31 minus the delay


def marker_event_time(watermark_ms: int) -> int:
    """Event time of a marker that moves an execution graph's Spark watermark to `watermark_ms`."""
    return watermark_ms + GRAPH_WATERMARK_DELAY_MS


_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")


def parse_duration_ms(text: str | int) -> int:
    """Parse '10s', '500ms', '2 minutes' (or a plain number of ms) into milliseconds."""
    if isinstance(text, int):
        return text
    if text.strip().isdigit():
        return int(text)
    match = _DURATION.match(text.lower())
    if not match or match.group(2) not in _UNITS_MS:
        raise ConfigError(f"cannot read duration {text!r}: use a number and a unit such as 10s, 500ms, 2m")
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def format_duration_ms(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def window_start(event_ms: int, size_ms: int) -> int:
    return (event_ms // size_ms) * size_ms


def window_end(event_ms: int, size_ms: int) -> int:
    return window_start(event_ms, size_ms) + size_ms


def common_boundary_ms(old_size_ms: int, new_size_ms: int) -> int:
    """The spacing of boundaries shared by both window sizes: their least common multiple."""
    return math.lcm(old_size_ms, new_size_ms)


def reached_cut(watermark_ms: int | None, cut_ms: int) -> bool:
    """Whether a watermark has passed the cut W, so every window up to W is closed.

    A cut at 0 has no window before it (event times start at 0, so every window ends after 0):
    it is reached at once, even before any watermark exists, and a swap on a source that never
    carried an event still completes.
    """
    return cut_ms <= 0 or (watermark_ms is not None and watermark_ms >= cut_ms)


def cut_boundary(max_window_end_ms: int, old_size_ms: int, new_size_ms: int) -> int:
    """The cut W: the first boundary at or after the largest routed window end that is a window
    boundary for both the old and the new query."""
    step = common_boundary_ms(old_size_ms, new_size_ms)
    return -(-max_window_end_ms // step) * step
