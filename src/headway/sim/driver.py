"""A replica as the simulator drives it: its engine model and its driver state."""

from __future__ import annotations

from typing import Final

from headway.core.engine.replica import ReplicaModel, StepResult

# Replica driver states: nothing to do, one step in flight, a decode run pending.
IDLE: Final = 0
STEP: Final = 1
RUN: Final = 2


class ReplicaDriver:
    """One replica and what the simulator knows about it.

    It is also the router's view of the replica (``routing.LoadView``): outstanding
    requests and tokens as the dispatcher counts them (dispatched, not yet finished), and
    the engine's KV and queue state for KV-aware routing.
    """

    __slots__ = (
        "alive",
        "busy_s",
        "draining",
        "index",
        "model",
        "outstanding_requests",
        "outstanding_tokens",
        "pending_finished",
        "pending_loss",
        "ready",
        "revision",
        "run_start_s",
        "run_steps",
        "started_s",
        "state",
        "step_result",
        "stopped_s",
        "version",
    )

    def __init__(self, index: int, model: ReplicaModel) -> None:
        self.index = index
        self.model = model
        self.state = IDLE
        self.version = 0
        self.step_result: StepResult | None = None
        self.run_start_s = 0.0
        """In state ``RUN``: when the pending decode run started (nothing applied yet)."""
        self.run_steps = 0
        """In state ``RUN``: the steps the pending decode run has planned."""
        self.pending_finished: tuple[int, ...] = ()
        self.busy_s = 0.0
        """Seconds it spent stepping (its GPUs at work; the rest of its time they idle)."""
        self.outstanding_requests = 0
        self.outstanding_tokens = 0
        self.revision: str | None = None
        self.ready = True
        """The router may choose it (started, not lost, not draining)."""
        self.alive = True
        """Not lost to a fault, not removed by the autoscaler."""
        self.draining = False
        """Removed by the autoscaler: it finishes its calls and takes no new ones."""
        self.pending_loss: str | None = None
        """A ``replica_lost`` fault waiting for a step of this phase to strike."""
        self.started_s = 0.0
        """When it was provisioned (billing starts)."""
        self.stopped_s: float | None = None
        """When it stopped (lost, or drained after a scale-down); None: still up."""

    @property
    def free_kv_blocks(self) -> int:
        """Blocks not held by a request (the engine's view; materialize first)."""
        return self.model.scheduler.pool.num_free

    @property
    def waiting_requests(self) -> int:
        """Requests waiting for admission in the engine."""
        return self.model.num_waiting
