"""Window arithmetic shared by the executor and the service graph.

Windows are tumbling and aligned to the Unix epoch, as Spark's `window()` builds them without a
start offset: the window of event time t (ms) with size s is [floor(t/s)*s, floor(t/s)*s + s).
"""

from __future__ import annotations

import math
import re

from contract.errors import ConfigError

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


def cut_boundary(max_window_end_ms: int, old_size_ms: int, new_size_ms: int) -> int:
    """The cut W: the first boundary at or after the largest routed window end that is a window
    boundary for both the old and the new query."""
    step = common_boundary_ms(old_size_ms, new_size_ms)
    return -(-max_window_end_ms // step) * step
