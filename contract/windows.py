"""Window arithmetic shared by the executor and the service graph.

Windows are aligned to the Unix epoch, as Spark's `window()` builds them without a start offset.
A tumbling window of size s holds event time t (ms) in [floor(t/s)*s, floor(t/s)*s + s). A sliding
window of size s every d (d divides s) starts and ends on multiples of d, so t lies in s/d windows:
those ending on a multiple of d in (t, t + s]. Either way, a query's window ends lie on its *grid*:
every slide (its size when tumbling). See README, "Sliding windows".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Windowing:
    """A query's windows: their size and how often one starts (slide == size: tumbling)."""

    size_ms: int
    slide_ms: int

    @classmethod
    def of(cls, size_ms: int, slide_ms: int | None = None) -> Windowing:
        """A size and a slide; no slide: tumbling windows (the slide is the size)."""
        return cls(size_ms, size_ms if slide_ms is None else slide_ms)

    @property
    def sliding(self) -> bool:
        return self.slide_ms != self.size_ms

    @property
    def grid_ms(self) -> int:
        """The spacing of window ends (and starts): the slide."""
        return self.slide_ms

    @property
    def reach_ms(self) -> int:
        """How far before a window end W the first window ending after W starts: size - slide
        (0 for tumbling windows, whose first window after W starts at W)."""
        return self.size_ms - self.slide_ms

    def describe(self) -> str:
        size = format_duration_ms(self.size_ms)
        return f"{size} every {format_duration_ms(self.slide_ms)}" if self.sliding else size


def common_boundary_ms(old_grid_ms: int, new_grid_ms: int) -> int:
    """The spacing of window boundaries shared by two grids (slides; sizes for tumbling windows):
    their least common multiple."""
    return math.lcm(old_grid_ms, new_grid_ms)


def first_row_needed(cut_ms: int, new: Windowing) -> int:
    """The earliest event time the new version of a swap cut at W needs: its first window after W
    (ending at W + slide) starts at W - size + slide. Rows from there up to W go to both versions."""
    return cut_ms - new.reach_ms


def buffer_start(cut_ms: int, old: Windowing, new: Windowing, rolls_back: bool) -> int:
    """The earliest event time the new graph of a swap cut at W receives: what its own first window
    after W needs and, for a swap that rolls back on its own, what the old version's would."""
    return cut_ms - max(new.reach_ms, old.reach_ms if rolls_back else 0)


def promotion_boundary(
    max_window_end_ms: int | None, old: Windowing, new: Windowing, since_ms: int, watermark_ms: int | None = None
) -> int:
    """The cut W of a shadow's promotion: the first multiple of both grids at or after

        max(S, E,  min(M, E + old.size - old.slide))

    where S is the shadow's start. A shadow has received every row from S - new.size + new.slide
    on, so its windows ending after any W >= S hold all their rows: W need not wait for
    E + new.size - new.slide, as a fresh graph's cut does (cut_boundary). The old version keeps every
    window through W, so W is at or after E; the last term is cut_boundary's, for a sliding old
    version whose watermark ran ahead."""
    lower = since_ms if max_window_end_ms is None else max(since_ms, max_window_end_ms)
    if watermark_ms is not None and max_window_end_ms is not None:
        lower = max(lower, min(watermark_ms, max_window_end_ms + old.reach_ms))
    step = common_boundary_ms(old.grid_ms, new.grid_ms)
    return -(-lower // step) * step


def reached_cut(watermark_ms: int | None, cut_ms: int) -> bool:
    """Whether a watermark has passed the cut W, so every window up to W is closed.

    A cut at 0 has no window before it (event times start at 0, so every window ends after 0):
    it is reached at once, even before any watermark exists, and a swap on a source that never
    carried an event still completes.
    """
    return cut_ms <= 0 or (watermark_ms is not None and watermark_ms >= cut_ms)


def cut_boundary(
    max_window_end_ms: int | None,
    old: Windowing,
    new: Windowing,
    watermark_ms: int | None = None,
    rolls_back: bool = False,
) -> int:
    """The cut W of a swap from `old` to `new` windows, taken when the largest window end routed so
    far (over every source partition, on the service graph's window) is E and the service watermark
    is M: the first multiple of both grids (the lcm of the slides) at or after

        max(E + new.size - new.slide,  min(M, E + old.size - old.slide))

    - E + new.size - new.slide: the new version's first window after W starts at W - size + slide,
      and it must receive every row of that window. Rows before E were routed before the cut, to
      the old graph alone, so its first window may start no earlier than E. (Tumbling: W >= E.)
    - min(M, E + old.size - old.slide), only binding for a sliding old version whose watermark
      has run ahead of E (a quiet source): it may have closed windows ending up to M already, and
      one ending after W would not be its own. Either W >= M, or its windows ending after W start
      at or after E, so they held no row when they closed (later rows before M are late).
    Every row routed before the cut is older than E, so no rule needs the rows' own times. With
    nothing routed yet (E None) any boundary works: W = 0, reached at once (`reached_cut`).

    A swap that `rolls_back` on its own keeps, in its new graph's topic, every row the old version's
    windows after W would need (`buffer_start`), so that its automatic rollback can take over from W:
    then W >= E + old.size - old.slide too (a later cut only when the old version slides).
    """
    if max_window_end_ms is None:
        return 0
    lower = max_window_end_ms + max(new.reach_ms, old.reach_ms if rolls_back else 0)
    if watermark_ms is not None:
        lower = max(lower, min(watermark_ms, max_window_end_ms + old.reach_ms))
    step = common_boundary_ms(old.grid_ms, new.grid_ms)
    return -(-lower // step) * step
