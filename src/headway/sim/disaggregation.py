"""Prefill/decode disaggregation: its settings and the hand-off between the pools.

A call prefills on a prefill replica (its first token), its prompt KV moves to a decode
replica the decode pool's router picks, and it decodes its other tokens there. A call
withdrawn between the pools cancels its transfer, or voids the one its last prefill step
would start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from headway.core.engine.scheduler import EngineRequest
from headway.core.pickling import reduce_by_fields
from headway.core.policy.autoscaler import Autoscaler
from headway.core.policy.routing import Router
from headway.sim.driver import IDLE, STEP, ReplicaDriver
from headway.sim.events import EV_BOUNDARY, EV_KV_ARRIVED
from headway.sim.faults import Fault
from headway.sim.gateway import SimGateway
from headway.sim.kernel import BOUNDARY, DISPATCH
from headway.sim.replicas import ReplicaStepping


@dataclass(frozen=True, slots=True, kw_only=True)
class Disaggregation:
    """Prefill/decode disaggregation as the simulator runs it (``docs/simulate.md``).

    Replicas ``0..prefill_replicas - 1`` only prefill (each call runs there with
    ``max_output_tokens=1``: the first token); the others only decode. A call's prompt KV
    then moves to a decode replica in ``kv_transfer_latency_s + prompt tokens ×
    kv_transfer_s_per_token`` and decodes its other tokens there.
    """

    prefill_replicas: int
    """Replicas that only prefill (the first ones); the rest only decode."""

    kv_transfer_s_per_token: float
    """Seconds to move one prompt token's KV: its KV bytes per GPU over the per-GPU,
    one-direction bandwidth (every GPU of the tensor-parallel group sends its shard)."""

    kv_transfer_latency_s: float = 0.0
    """Fixed latency of one transfer (the interconnect's)."""

    def __post_init__(self) -> None:
        if self.prefill_replicas < 1:
            raise ValueError(
                f"disaggregation.prefill_replicas must be >= 1 (got {self.prefill_replicas})"
            )
        for name in ("kv_transfer_s_per_token", "kv_transfer_latency_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"disaggregation.{name} must be finite and >= 0 (got {value})")

    def __reduce__(self) -> tuple[Callable[[], Disaggregation], tuple[()]]:
        """Pickle by calling the class (compiled, the default refuses a frozen class)."""
        return reduce_by_fields(self)


def check_disaggregation(
    disagg: Disaggregation,
    num_replicas: int,
    gateway: SimGateway | None,
    faults: Sequence[Fault],
    autoscaler: Autoscaler | None,
) -> None:
    """Raise ``ValueError`` for a disaggregated run the simulator does not support."""
    if not disagg.prefill_replicas < num_replicas:
        raise ValueError(
            f"disaggregation.prefill_replicas must be < replicas ({num_replicas}) "
            f"(got {disagg.prefill_replicas}); at least one replica must decode"
        )
    unsupported = [
        name
        for name, used in (
            ("gateway", gateway is not None),
            ("faults", bool(faults)),
            ("autoscaler", autoscaler is not None),
        )
        if used
    ]
    if unsupported:
        raise ValueError(
            f"disaggregation is not simulated together with {', '.join(unsupported)} yet; "
            "remove those or the disaggregation"
        )


class DisaggregatedHandoff(ReplicaStepping):
    """The simulator's disaggregated calls: prefill done, KV moved, withdrawn between."""

    def _init_disaggregation(self, disagg: Disaggregation | None, router: Router) -> None:
        """The pools' split, the decode pool's router, and no transfers yet (after the
        duplicates' rows exist: a transfer time is kept per row)."""
        self._disagg = disagg
        self._num_prefill = 0 if disagg is None else disagg.prefill_replicas
        self._decode_router = Router(kind=router.kind, affinity_slack=router.affinity_slack)
        """Picks among the decode replicas (its own turn and affinity memory)."""
        self._kv_transfer_s = [math.nan] * len(self._call_in)
        self._transferring: dict[int, int] = {}
        """Rows whose prompt KV is on its way to their decode replica: the transfer's number
        (an ``EV_KV_ARRIVED`` event for another number is void)."""
        self._prefill_void: set[tuple[int, int]] = set()
        """``(row, prefill replica)`` of attempts withdrawn while the step that ends their
        prefill ran: no transfer follows (the row may meanwhile retry elsewhere)."""
        self._on_decode = set()
        self._num_transfers = 0
        self._transfer_s_total = 0.0

    def _prefill_finished(self, r: int, now: float, driver: ReplicaDriver) -> None:
        """Row ``r`` emitted its first token on prefill replica ``driver``: pick its decode
        replica (the decode pool's router) and start moving its prompt KV there."""
        self._record_stay(r, now, self._call_in[r], 1, self._call_in[r] + 1, False)
        driver.outstanding_requests -= 1
        self._outstanding[driver.index] -= 1
        driver.outstanding_tokens -= self._call_in[r] + 1
        if (r, driver.index) in self._prefill_void:  # withdrawn during its last prefill step
            self._prefill_void.discard((r, driver.index))
            return
        disagg = self._disagg
        assert disagg is not None
        choice = self._route_pool(r, now, self._num_prefill, len(self.drivers), self._decode_router)
        assert choice >= 0  # every decode replica is always eligible
        target = self.drivers[choice]
        target.outstanding_requests += 1
        self._outstanding[choice] += 1
        target.outstanding_tokens += self._call_in[r] + self._call_out[r]
        self._replica[r] = choice
        prompt = self._call_in[r]
        transfer_s = disagg.kv_transfer_latency_s + prompt * disagg.kv_transfer_s_per_token
        self._kv_transfer_s[r] = transfer_s
        self._num_transfers += 1
        self._transfer_s_total += transfer_s
        self._transferring[r] = self._num_transfers
        self.events.push(now + transfer_s, DISPATCH, EV_KV_ARRIVED, r, self._num_transfers)

    def _kv_arrived(self, r: int, transfer: int, now: float) -> None:
        """Row ``r``'s prompt KV reached its decode replica: it joins that replica's queue
        with the prompt and the first token known, the prompt's KV computed (external),
        and its other ``output - 1`` tokens to generate."""
        if self._transferring.get(r) != transfer:
            return  # withdrawn during the transfer
        del self._transferring[r]
        choice = self._replica[r]
        driver = self.drivers[choice]
        self._materialize(driver, now)
        prompt = self._call_in[r]
        req = EngineRequest(
            r,
            num_prompt_tokens=prompt + 1,
            max_output_tokens=self._call_out[r] - 1,
            priority=self._call_prio[r],
            num_external_computed_tokens=prompt,
        )
        driver.model.add_request(req, now)
        self._replica_enter_s[r] = now
        self._on_decode.add(r)
        if driver.state == IDLE:
            driver.state = STEP
            driver.step_result = None
            driver.version += 1
            self.events.push(now, BOUNDARY, EV_BOUNDARY, choice, driver.version)

    def _withdraw_disaggregated(self, j: int, now: float) -> bool:
        """:meth:`_withdraw` for a row between the pools: its KV in transfer (cancelled;
        the decode replica's count given back), or its prefill done in the step in flight
        (the transfer that step's end would start is void). False for the others."""
        if j in self._transferring:
            del self._transferring[j]
            driver = self.drivers[self._replica[j]]
            driver.outstanding_requests -= 1
            self._outstanding[driver.index] -= 1
            driver.outstanding_tokens -= self._call_in[j] + self._call_out[j]
            self._num_output_tokens[j] = 1
            return True
        replica = self._replica[j]
        if replica >= self._num_prefill or self._call_out[j] <= 1:
            return False
        driver = self.drivers[replica]
        self._materialize(driver, now)
        if driver.model.scheduler.get_request(j) is not None:
            return False  # still prefilling: aborted there as usual
        # Its last prefill step is in flight: the step ends, the call does not go on.
        self._prefill_void.add((j, replica))
        self._num_output_tokens[j] = 1
        return True
