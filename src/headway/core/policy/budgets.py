"""Tenant budgets from entitlements: each tenant may use its share of planned capacity.

A tenant that floods the service must not take the others' capacity (seed 000: "give
unlike workloads separate budgets"; seed 002: "a tenant sending ten times its share").
Fair queuing alone cannot stop that once every dispatch slot is busy: a light tenant's
request still waits for a slot, and the engine's batch, swollen with the flood, is
slower for everyone. A budget keeps the flood out of the engine altogether::

    token_rate_per_s(t) = share(t) / sum(shares) * capacity_tokens_per_s
    burst               = burst_s seconds of that rate

``capacity_tokens_per_s`` is the planned capacity in the tokens admission charges
(prompt plus planned output), not the peak: the driver plans it as the replicas'
saturation throughput times the workload's planning factor. Tenants with share 0 (batch
or control work that is governed by its priority band) get no budget; with fewer than
two entitled tenants there is nobody to protect and nothing is budgeted.

``work_conserving`` budgets bind only under contention (``TenantLimits.work_conserving``):
a tenant over its share borrows from the pool of the budgets' summed rates (the capacity
their shares split) what the others leave of it, while no other tenant waits; a flood
drains the pool within seconds and then meets its own budget. Hard budgets refuse a
tenant above its share even while the others are idle: the strictest isolation, at the
cost of capacity nobody else wanted (at normal load a trace's small, bursty tenants were
refused a third of their calls that way).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from headway.core.policy.admission import TenantLimits
from headway.core.policy.queues import FAIR_AFTER_S

__all__ = ["share_budgets"]


def share_budgets(
    shares: Mapping[str, float],
    capacity_tokens_per_s: float,
    *,
    burst_s: float = 10.0,
    work_conserving: bool = False,
    contended_after_s: float = FAIR_AFTER_S,
) -> dict[str, TenantLimits]:
    """Token budgets of the tenants with a positive share (see the module docstring);
    ``contended_after_s``: the wait that binds a work-conserving one (the queues'
    ``fair_after_s``)."""
    if not (math.isfinite(capacity_tokens_per_s) and capacity_tokens_per_s > 0):
        raise ValueError(
            f"capacity_tokens_per_s must be a positive number (got {capacity_tokens_per_s!r})"
        )
    entitled = {t: s for t, s in shares.items() if s > 0}
    if len(entitled) < 2:
        return {}
    total = sum(entitled.values())
    return {
        t: TenantLimits(
            token_rate_per_s=s / total * capacity_tokens_per_s,
            burst_s=burst_s,
            work_conserving=work_conserving,
            contended_after_s=contended_after_s,
        )
        for t, s in entitled.items()
    }
