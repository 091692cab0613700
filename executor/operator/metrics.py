"""Prometheus metrics of a running executor, served on `/metrics` (see web.py).

A custom collector builds every swap and pipeline metric at scrape time from the journal and the
control state in Redis (observe.take_snapshot), so the metrics keep no second truth: a counter is
a count of journal entries or a counter Redis holds, a phase duration is the time between two
journal entries. Results written are Kafka's count (the results topic's end offsets, see
observe.py). Two things live only in the executor's process, and are read from there: the lease's
renewals (the heartbeat counts them) and each Spark query's micro-batch durations (its
`lastProgress`, polled by `BatchDurations`).

Names follow Prometheus conventions: a `hotswap_` prefix, `_total` for counters, `_seconds` for
durations and times (epoch seconds for watermarks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from hotswap.contract.journal import SwapPhase
from hotswap.contract.models import ExecutorPhase
from hotswap.contract.names import ROUTED, SKIPPED, STALLED
from hotswap.executor.operator.observe import Snapshot

log = structlog.get_logger(__name__)

# Phases last from well under a second (validated) to minutes (a drain behind a backlog).
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SWAP_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
POLL_S = 1.0  # how often BatchDurations reads each query's lastProgress


class LeaseCounts(Protocol):
    @property
    def renewals(self) -> int: ...

    @property
    def renewal_failures(self) -> int: ...


def _histogram(name: str, doc: str, label: str, samples: dict[str, list[float]], buckets: Sequence[float]) -> Any:
    family = HistogramMetricFamily(name, doc, labels=[label] if label else None)
    for value, observed in sorted(samples.items()):
        cumulative = [(str(b), float(sum(1 for s in observed if s <= b))) for b in buckets]
        cumulative.append(("+Inf", float(len(observed))))
        family.add_metric([value] if label else [], cumulative, sum(observed))
    return family


class SwapCollector(Collector):
    """Every metric read from the control state, built at each scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], lease: LeaseCounts | None = None) -> None:
        self._snapshot = snapshot
        self._lease = lease

    def describe(self) -> Iterable[Any]:
        return []  # built at scrape time: nothing to check at registration

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        yield from self._swaps(snap)
        yield from self._pipeline(snap)
        if self._lease is not None:
            yield CounterMetricFamily(
                "hotswap_lease_renewals", "Renewals of the executor's lease.", value=self._lease.renewals
            )
            yield CounterMetricFamily(
                "hotswap_lease_renewal_failures",
                "Lease renewals that failed (Redis unreachable, or the lease taken by another executor).",
                value=self._lease.renewal_failures,
            )

    # -- swaps ---------------------------------------------------------------------------------
    def _swaps(self, snap: Snapshot) -> Iterator[Any]:
        swaps = snap.status.swaps
        outcomes = CounterMetricFamily(
            "hotswap_swaps",
            "Swaps by outcome: each terminal phase a swap entered, and `stranded` (a completed swap rolled back "
            "later counts in both `completed` and `rolled_back`, a stranded one fixed later in both `stranded` and "
            "`fixed_forward`).",
            labels=["outcome"],
        )
        transitions = CounterMetricFamily(
            "hotswap_swap_phase_transitions",
            "Phase transitions recorded in the journal, by phase entered.",
            labels=["phase"],
        )
        entered: dict[str, int] = {str(p): 0 for p in SwapPhase}
        # The phase table says which phases end a swap, or leave it to an operator (stranded).
        ended: dict[str, int] = {str(p): 0 for p in SwapPhase if p.is_settled}
        spent: dict[str, list[float]] = {}
        totals: list[float] = []
        for swap in swaps:
            for i, phase in enumerate(swap.phases):
                entered[str(phase.name)] = entered.get(str(phase.name), 0) + 1
                if phase.name.is_settled:
                    ended[str(phase.name)] = ended.get(str(phase.name), 0) + 1
                if i + 1 < len(swap.phases):
                    spent.setdefault(str(phase.name), []).append((swap.phases[i + 1].at - phase.at) / 1000)
            end = next((p.at for p in swap.phases if p.name.is_terminal), None)
            if end is not None and swap.phases:
                totals.append((end - swap.phases[0].at) / 1000)
        for outcome, n in sorted(ended.items()):
            outcomes.add_metric([outcome], n)
        for name, n in sorted(entered.items()):
            transitions.add_metric([name], n)
        yield outcomes
        yield transitions
        yield _histogram(
            "hotswap_swap_phase_duration_seconds",
            "Time a swap spent in a phase: from entering it to entering the next (journal timestamps).",
            "phase",
            spent,
            PHASE_BUCKETS,
        )
        yield _histogram(
            "hotswap_swap_duration_seconds",
            "From submitted to the swap's terminal phase.",
            "",
            {"": totals},
            SWAP_BUCKETS,
        )
        active = snap.active_swap
        phase_gauge = GaugeMetricFamily(
            "hotswap_swap_phase",
            "The phase of the swap in progress: 1 for its phase, 0 for the others (all 0 when none runs).",
            labels=["phase"],
        )
        for each in SwapPhase:
            phase_gauge.add_metric([str(each)], 1.0 if active is not None and active.state is each else 0.0)
        yield phase_gauge
        elapsed = GaugeMetricFamily(
            "hotswap_swap_phase_elapsed_seconds", "How long the swap in progress has been in its phase (0: none)."
        )
        elapsed.add_metric([], (snap.at_ms - active.phases[-1].at) / 1000 if active and active.phases else 0.0)
        yield elapsed
        info = GaugeMetricFamily(
            "hotswap_swap_in_progress",
            "1 for the swap in progress, labelled with its id and queries (no sample when none runs).",
            labels=["swap_id", "from_query", "to_query"],
        )
        if active is not None:
            info.add_metric([active.id, active.from_query or "", active.to_query], 1.0)
        yield info
        queued = GaugeMetricFamily("hotswap_swaps_unfinished", "Swaps submitted and not ended (the queue).")
        queued.add_metric([], float(sum(1 for s in swaps if not s.state.is_terminal)))
        yield queued

    # -- the pipeline --------------------------------------------------------------------------
    def _pipeline(self, snap: Snapshot) -> Iterator[Any]:
        status = snap.status
        routed = CounterMetricFamily(
            "hotswap_routed_records", "Rows the service graph routed to each execution graph.", labels=["query_id"]
        )
        for query_id, n in sorted(snap.per_query(ROUTED).items()):
            routed.add_metric([query_id], n)
        yield routed
        stalled = CounterMetricFamily(
            "hotswap_stalled_batches",
            "Batches cancelled for running longer than batch_stall_timeout, by query (`service`: the service graph).",
            labels=["query_id"],
        )
        for query_id, n in sorted(snap.per_query(STALLED).items()):
            stalled.add_metric([query_id], n)
        yield stalled
        skipped = CounterMetricFamily(
            "hotswap_skipped_batches",
            "Batches the serving query failed on for good and went on without, their rows dead-lettered "
            "(poison_batches = dead_letter), by query.",
            labels=["query_id"],
        )
        for query_id, n in sorted(snap.per_query(SKIPPED).items()):
            skipped.add_metric([query_id], n)
        yield skipped
        if snap.results_written is not None:
            yield CounterMetricFamily(
                "hotswap_results_written",
                "Records in the results topic (the sum of its end offsets; a batch replayed after a crash counts "
                "again).",
                value=snap.results_written,
            )
        yield CounterMetricFamily(
            "hotswap_source_records_read", "Source rows the service graph has read.", value=snap.source_read
        )
        yield CounterMetricFamily(
            "hotswap_late_records",
            "Rows older than the service watermark, sent to the late topic.",
            value=status.late_records,
        )
        dead = CounterMetricFamily(
            "hotswap_dead_letter_records",
            "Rows sent to the dead-letter topic, by reason code.",
            labels=["reason"],
        )
        for reason, n in snap.dead_letters_by_reason.items():
            dead.add_metric([reason], n)
        yield dead
        yield CounterMetricFamily(
            "hotswap_service_skipped_reads",
            "Service-graph batches replayed because Spark's read skipped source records that Kafka still held.",
            value=status.service.skipped_reads,
        )
        yield CounterMetricFamily(
            "hotswap_expired_records",
            "Source rows Kafka's retention deleted before the service graph read them.",
            value=status.expired_records,
        )
        watermark = status.service.watermark
        if watermark is not None:
            yield GaugeMetricFamily(
                "hotswap_service_watermark_seconds",
                "The service watermark (event time, epoch seconds).",
                value=watermark / 1000,
            )
            yield GaugeMetricFamily(
                "hotswap_service_watermark_lag_seconds",
                "Wall time minus the service watermark.",
                value=(snap.at_ms - watermark) / 1000,
            )
        event_time = GaugeMetricFamily(
            "hotswap_partition_event_time_seconds",
            "Largest event time each source partition has routed (epoch seconds).",
            labels=["partition"],
        )
        idle = GaugeMetricFamily(
            "hotswap_partition_idle", "1 for a source partition set aside as idle.", labels=["partition"]
        )
        for p, node in status.service.partitions.items():
            if node.event_time is not None:
                event_time.add_metric([p], node.event_time / 1000)
            idle.add_metric([p], 1.0 if node.idle else 0.0)
        yield event_time
        yield idle
        committed = GaugeMetricFamily(
            "hotswap_graph_committed_watermark_seconds",
            "Watermark of each execution graph's last committed batch: every window ending at or before it was "
            "emitted (epoch seconds).",
            labels=["query_id"],
        )
        for query_id, graph in status.graphs.items():
            if graph.progress is not None and graph.progress.committed_watermark is not None:
                committed.add_metric([query_id], graph.progress.committed_watermark / 1000)
        yield committed
        executor = GaugeMetricFamily(
            "hotswap_executor_phase", "The executor's phase: 1 for it, 0 for the others.", labels=["phase"]
        )
        for phase in ExecutorPhase:
            executor.add_metric([str(phase)], 1.0 if status.executor.phase is phase else 0.0)
        yield executor


class QueryProgress(Protocol):
    """The part of a Spark StreamingQuery read here."""

    @property
    def name(self) -> str | None: ...

    @property
    def lastProgress(self) -> Mapping[str, Any] | None: ...

    @property
    def recentProgress(self) -> Sequence[Mapping[str, Any]]: ...


class BatchDurations:
    """Micro-batch durations of the namespace's Spark queries, from each one's progress reports
    (`durationMs.triggerExecution`), observed once per batch id into a histogram labelled by query:
    `service` for the service graph, the query id for an execution graph."""

    def __init__(self, registry: CollectorRegistry, prefix: str, queries: Callable[[], Iterable[QueryProgress]]):
        self._prefix = prefix  # hotswap.<ns>.: the namespace's Spark query names start with it
        self._queries = queries
        self._seen: dict[str, int] = {}
        self.histogram = Histogram(
            "hotswap_microbatch_duration_seconds",
            "Duration of each micro-batch of the service graph and of each execution graph (Spark's triggerExecution).",
            ["query"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def label(self, name: str | None) -> str | None:
        if not name or not name.startswith(self._prefix):
            return None
        short = name.removeprefix(self._prefix)
        return short.removeprefix("graph.")

    def poll(self) -> None:
        for query in list(self._queries()):
            label = self.label(query.name)
            last = query.lastProgress if label else None
            if label is None or not last:
                continue
            batch = int(last.get("batchId", -1))
            seen = self._seen.get(label, -1)
            if batch <= seen:
                continue
            # Batches finished since the last poll: all of them when more than one did.
            reports = [last] if batch == seen + 1 or seen < 0 else list(query.recentProgress)
            for report in reports:
                report_batch = int(report.get("batchId", -1))
                if seen < report_batch <= batch:
                    duration = (report.get("durationMs") or {}).get("triggerExecution")
                    if duration is not None:
                        self.histogram.labels(label).observe(float(duration) / 1000)
            self._seen[label] = batch

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hotswap-batch-durations", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a stopping session: the next poll (or stop) decides
                log.debug("micro-batch durations not read", error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def metrics_registry(
    snapshot: Callable[[], Snapshot],
    lease: LeaseCounts | None = None,
    queries: Callable[[], Iterable[QueryProgress]] | None = None,
    prefix: str = "",
) -> tuple[CollectorRegistry, BatchDurations | None]:
    """A registry of hotswap's metrics only (no process or platform collectors: the executor is a
    Spark driver, whose JVM has its own)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwapCollector(snapshot, lease))
    durations = BatchDurations(registry, prefix, queries) if queries is not None else None
    return registry, durations
