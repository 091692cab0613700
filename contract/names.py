"""Every name derived from a namespace and a query id, in one place.

- `Keys`: the Redis keys of one namespace. Each carries the namespace in a hash tag (`{ns}`), so one
  Redis can host many deployments and a Redis Cluster keeps a namespace's keys in one slot, which
  MULTI/EXEC transactions need.
- `Names`: the Kafka topics hotswap owns (`hotswap.<ns>.…`), the Spark query names and the Spark
  checkpoint directories. A graph's topic and its Spark query share one name, so Spark's UI and
  Kafka's tools show the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Counter names in the counters hash (`Keys.counters`), each cumulative over the namespace's life.
LATE_RECORDS = "late_records"  # rows older than the service watermark, sent to the late topic
DEAD_LETTER_RECORDS = "dead_letter_records"  # rows sent to the dead-letter topic, whatever the reason
EXPIRED_RECORDS = "expired_records"  # rows the source's retention deleted before the service graph read them
SKIPPED_READS = "skipped_reads"  # service batches replayed: Spark's read skipped records Kafka held
# ... and those followed by a name: a query id (or `service`), or a dead letter's reason code.
ROUTED = "routed:"  # rows the service graph routed to each graph
DEAD_LETTER = "dead_letter:"  # dead-lettered rows by reason code
STALLED = "stalled_batches:"  # batches cancelled for running longer than batch_stall_timeout
SKIPPED = "skipped_batches:"  # poison batches a graph skipped, its rows dead-lettered (poison_batches)


@dataclass(frozen=True)
class Keys:
    namespace: str

    @property
    def prefix(self) -> str:
        return f"hotswap:{{{self.namespace}}}"

    @property
    def lease(self) -> str:
        """The executor's lease: only the holder of this key may act on the namespace."""
        return f"{self.prefix}:lease"

    @property
    def namespace_record(self) -> str:
        """Written once, when the namespace's first executor starts. If it is missing while an
        executor runs, or while checkpoints and graph topics of the namespace exist, the control
        state was lost."""
        return f"{self.prefix}:namespace"

    @property
    def executor(self) -> str:
        """The executor's recorded lifecycle phase (ExecutorRecord)."""
        return f"{self.prefix}:executor"

    @property
    def current(self) -> str:
        """The query that serves windows after every cut so far."""
        return f"{self.prefix}:current"

    @property
    def graphs(self) -> str:
        """Hash: query id -> GraphRecord."""
        return f"{self.prefix}:graphs"

    @property
    def swaps(self) -> str:
        """List of swap ids in submission order."""
        return f"{self.prefix}:swaps"

    @property
    def open_swaps(self) -> str:
        """List of the ids of swaps that are not over (not terminal; stranded ones included), in
        submission order: kept in the same write as each transition, so reading the swaps that matter
        now does not grow with the journal's history."""
        return f"{self.prefix}:swaps:open"

    @property
    def journal_version(self) -> str:
        """A counter every journal write increments: a reader that caches what it derived from the
        journal (a graph's owned windows) reads this one number per batch, not the whole history."""
        return f"{self.prefix}:journal-version"

    def swap(self, swap_id: str) -> str:
        return f"{self.prefix}:swap:{swap_id}"

    @property
    def service(self) -> str:
        """The service graph's node positions and watermark after its last routed batch."""
        return f"{self.prefix}:service"

    def routing_plan(self, batch_id: int) -> str:
        """Write-ahead routing decision for one service-graph batch (replayed identically)."""
        return f"{self.prefix}:routing:{batch_id}"

    @property
    def rewrites(self) -> str:
        """Hash: service batch id -> Rewrite, the event times at which a replayed service batch may
        have written rows to the graphs' topics a second time (contract/rewrites.py)."""
        return f"{self.prefix}:rewrites"

    @property
    def rewrites_recorded(self) -> str:
        """Set once the namespace's service graph records its replays' rewrites (contract/rewrites.py)."""
        return f"{self.prefix}:rewrites-recorded"

    def shadow_diff(self, swap_id: str) -> str:
        """The last `hotswap diff` of a shadow (a ShadowDiff), which `status` shows."""
        return f"{self.prefix}:shadow-diff:{swap_id}"

    def progress(self, query_id: str) -> str:
        """The service sink's report of one execution graph's progress."""
        return f"{self.prefix}:progress:{query_id}"

    @property
    def forgotten_names(self) -> str:
        """Hash of query name -> the highest number a forgotten graph of that name had (retention):
        a query id is never given twice, even after its graph's record is gone."""
        return f"{self.prefix}:forgotten-names"

    @property
    def counters(self) -> str:
        """Hash of counters: late_records, dead_letter_records, expired_records, stalled batches
        (`STALLED` + the query id, or `service`)."""
        return f"{self.prefix}:counters"

    @property
    def requests(self) -> str:
        """List of operator request ids waiting for the executor (contract.requests), oldest last."""
        return f"{self.prefix}:requests"

    def request(self, request_id: str) -> str:
        """An operator request (submit, abort, promote), with a time-to-live, until the executor takes it."""
        return f"{self.prefix}:request:{request_id}"

    def request_answer(self, request_id: str) -> str:
        """The executor's answer to an operator request (RequestAnswer), with a time-to-live."""
        return f"{self.prefix}:request:{request_id}:answer"

    @property
    def dry_runs(self) -> str:
        """List of dry-run request ids waiting for the executor (`hotswap submit --dry-run`)."""
        return f"{self.prefix}:dry-runs"

    def dry_run(self, request_id: str) -> str:
        """A dry-run request (the query), with a time-to-live: it changes nothing else."""
        return f"{self.prefix}:dry-run:{request_id}"

    def dry_run_plan(self, request_id: str) -> str:
        """The executor's answer to a dry-run request (DryRunPlan), with a time-to-live."""
        return f"{self.prefix}:dry-run:{request_id}:plan"


@dataclass(frozen=True)
class Names:
    namespace: str
    home: Path  # `settings.home`: checkpoints live below it unless `checkpoints` says where
    checkpoints: str | None = None  # `settings.checkpoint_root`: a directory or an s3a:// URI

    # -- Kafka topics ------------------------------------------------------------------------
    @property
    def owned_topic_prefix(self) -> str:
        """Topics hotswap owns in the namespace: graph topics, late and dead-letter. (Not the source
        or results topics: those belong to the user.)"""
        return f"hotswap.{self.namespace}."

    @property
    def late_topic(self) -> str:
        return f"{self.owned_topic_prefix}late"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.owned_topic_prefix}dead-letter"

    def graph_topic(self, query_id: str) -> str:
        """The execution graph's input topic: the buffer between the service graph and the query."""
        return f"{self.owned_topic_prefix}graph.{query_id}"

    def shadow_results_topic(self, query_id: str) -> str:
        """A shadow's results (`submit --shadow`): what it answers before it is promoted, never the
        user's sink; `hotswap diff` compares them with the current version's."""
        return f"{self.owned_topic_prefix}shadow.{query_id}"

    # -- Spark query names -------------------------------------------------------------------
    @property
    def service_query(self) -> str:
        return f"{self.owned_topic_prefix}service"

    def graph_query(self, query_id: str) -> str:
        return self.graph_topic(query_id)

    # -- Spark checkpoints -------------------------------------------------------------------
    # Locations are strings, not paths: on an object store (s3a://bucket/prefix) they are URIs that
    # only Hadoop's file system API (through Spark) reads and writes.
    @property
    def checkpoint_root(self) -> str:
        """Every Spark checkpoint of the namespace lives below this location: a local directory's
        absolute path, or a URI (`s3a://bucket/prefix/<namespace>`)."""
        if self.checkpoints is None:
            return str((self.home / "checkpoints" / self.namespace).resolve())
        if is_store_uri(self.checkpoints):
            return f"{self.checkpoints.rstrip('/')}/{self.namespace}"
        return str((Path(self.checkpoints).expanduser() / self.namespace).resolve())

    @property
    def local_checkpoint_root(self) -> Path | None:
        """The checkpoint root as a local directory, or None when it is on an object store."""
        root = self.checkpoint_root
        return None if is_store_uri(root) else Path(root)

    @property
    def service_checkpoint(self) -> str:
        return f"{self.checkpoint_root}/service"

    def graph_checkpoint(self, query_id: str) -> str:
        return f"{self.checkpoint_root}/graph-{query_id}"


def is_store_uri(location: str) -> bool:
    """Whether a checkpoint location names a store by URI (`s3a://…`) rather than a local directory."""
    return "://" in location
