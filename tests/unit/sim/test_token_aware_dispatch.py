"""Token-aware admission and dispatch: no preemptions where the same load preempts without."""

from __future__ import annotations

from pathlib import Path

import msgspec

from headway.core.workload.compile import compile_workload
from headway.core.workload.scale import scale_workload
from headway.files.workload import load_workload
from headway.sim.cluster import ClusterSpec
from headway.sim.gateway import GatewayConfig
from headway.sim.run import simulate_compiled

ROOT = Path(__file__).resolve().parents[3]


def test_headway_default_never_preempts_where_fifo_does() -> None:
    spec = load_workload(ROOT / "examples" / "overload.yaml").spec
    spec = msgspec.structs.replace(spec, duration_s=150.0)
    workload = compile_workload(scale_workload(spec, 0.8), seed=3)
    tight = ClusterSpec(replicas=1, model="llama-3-8b", gpu="h100", num_kv_blocks=3500)
    fifo, _ = simulate_compiled(workload, tight)
    default, _ = simulate_compiled(
        workload,
        msgspec.structs.replace(tight, gateway=GatewayConfig(preset="headway-default")),
    )
    assert fifo.engine.preemptions > 0, "the memory-tight run must preempt without admission"
    assert default.engine.preemptions == 0
    assert default.accounting.balanced and fifo.accounting.balanced
    # it did not get there by refusing everything
    assert default.completed_calls > 0.8 * fifo.completed_calls
