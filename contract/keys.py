"""The Redis key layout of one namespace.

Every key carries the namespace in a hash tag (`{ns}`), so one Redis can host many deployments and
a Redis Cluster keeps a namespace's keys in one slot, which MULTI/EXEC transactions need.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def swap(self, swap_id: str) -> str:
        return f"{self.prefix}:swap:{swap_id}"

    @property
    def service(self) -> str:
        """The service graph's node positions and watermark after its last routed batch."""
        return f"{self.prefix}:service"

    def routing_plan(self, batch_id: int) -> str:
        """Write-ahead routing decision for one service-graph batch (replayed identically)."""
        return f"{self.prefix}:routing:{batch_id}"

    def progress(self, query_id: str) -> str:
        """The service sink's report of one execution graph's progress."""
        return f"{self.prefix}:progress:{query_id}"

    @property
    def counters(self) -> str:
        """Hash of counters: late_records, dead_letter_records, expired_records."""
        return f"{self.prefix}:counters"
