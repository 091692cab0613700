"""When a live service batch ends: just after the next window can close, not one trigger later.

Spark starts a processing-time trigger's batches on a grid of its interval (multiples of it since the
epoch), and window ends plus a lateness in whole seconds lie on that same grid. On a live source
whose events carry about the time they were sent, the event that lets the service watermark pass a
window end therefore arrives a few milliseconds after a batch has taken its offsets, and waits a
whole interval for the next batch: every result, and every swap's drain, came one interval late.

So a batch that read everything there was (fewer offsets than `max_offsets_per_trigger` less one per
partition, since Spark rounds each partition's share down) ends, when the next window would otherwise
close only in the batch after next, once that event should be in Kafka: the next batch starts then
and reads it. The moment is estimated from the batch itself (the
event time still needed, from the time the batch began), so a source whose events arrive late by a
steady lag is paced as well. The pause is never longer than one interval, never happens in a
backlog, and only moves the next batch's start; what a batch routes and writes is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

# After the moment the event should have arrived: for the hop from its producer to the broker.
ARRIVAL_MARGIN_MS = 30


@dataclass(frozen=True)
class BatchPace:
    """How a service batch is paced: its trigger's interval and the grid window ends lie on."""

    interval_ms: int  # the processing-time trigger's interval
    grid_ms: int  # window ends are multiples of it (the namespace's window)
    max_rows: int  # max_offsets_per_trigger: a batch that read about this many may have left some

    def pause_ms(self, *, began_ms: int, now_ms: int, watermark: int | None, read: int, partitions: int) -> int:
        """How long the batch Spark planned at `began_ms` (epoch ms), which read `read` offsets of the
        source's `partitions` and left the service watermark at `watermark`, waits before it ends; 0
        for none. Spark splits the row cap over the partitions and rounds each share down, so a batch
        within one offset per partition of the cap counts as capped: a backlog."""
        if watermark is None or read <= 0 or read + partitions >= self.max_rows:
            return 0  # nothing read, or a backlog: the next batch is due at once
        # The first window end the watermark has not passed (a window closes once the watermark is
        # beyond its end), and the moment the event that moves the watermark beyond it should arrive.
        next_end = -(-watermark // self.grid_ms) * self.grid_ms
        due = began_ms + (next_end + 1 - watermark) + ARRIVAL_MARGIN_MS
        next_trigger = (began_ms // self.interval_ms + 1) * self.interval_ms  # as Spark's trigger computes it
        if due <= next_trigger:
            return 0  # the next batch reads it anyway
        wait = due - now_ms
        return wait if 0 < wait <= self.interval_ms else 0
