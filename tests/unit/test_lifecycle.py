from typing import Any

from hotswap.contract.lifecycle import HEALTHY_RESET_S, RestartBudget, stop_between_batches


class BusyQuery:
    """A query always in a batch, as a busy graph looks to a poller."""

    def __init__(self) -> None:
        self.status_reads = 0
        self.stopped = False

    @property
    def isActive(self) -> bool:
        return not self.stopped

    @property
    def status(self) -> dict[str, Any]:
        self.status_reads += 1
        return {"isTriggerActive": True}

    def stop(self) -> None:
        self.stopped = True


def test_restarts_back_off_doubling_until_the_budget_is_spent() -> None:
    budget = RestartBudget(limit=2, backoff_s=2.0)
    assert budget.first_seen(100.0)
    assert not budget.first_seen(100.5)  # the same failure, seen again
    assert not budget.restart_due(101.9)
    assert budget.restart_due(102.0)  # 2 s after the failure
    budget.first_seen(110.0)
    assert not budget.restart_due(113.9)
    assert budget.restart_due(114.0)  # then 4 s
    assert budget.exhausted


def test_a_query_that_stays_healthy_gets_its_budget_back() -> None:
    budget = RestartBudget(limit=1, backoff_s=1.0)
    budget.first_seen(0.0)
    assert budget.restart_due(1.0)
    assert budget.exhausted
    budget.healthy(1.0 + HEALTHY_RESET_S / 2)
    assert budget.exhausted
    budget.healthy(2.0 + HEALTHY_RESET_S)
    assert not budget.exhausted


def test_a_query_stopped_without_finishing_its_batch_is_stopped_at_once() -> None:
    query = BusyQuery()
    times = stop_between_batches(query, timeout_s=0.0)
    assert query.stopped
    assert query.status_reads == 0
    assert times.waited_s == 0.0


def test_a_query_whose_batch_never_ends_is_stopped_when_the_wait_runs_out() -> None:
    query = BusyQuery()
    stop_between_batches(query, timeout_s=0.2)
    assert query.stopped
    assert query.status_reads > 1  # it did wait, polling, before stopping anyway
