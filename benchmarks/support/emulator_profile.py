"""The step-time profile the parity benchmarks give ``headway emulate`` and the simulator
alike, and the profile file the emulator and the gateway read it from."""

from __future__ import annotations

import json
from pathlib import Path

from headway.calibrate.profile import PROFILE_FORMAT
from headway.core.engine.steptime import AffineStepTime

TRUTH = AffineStepTime(
    overhead_s=0.005,
    per_prefill_token_s=6e-05,
    per_prefill_pair_s=2e-09,
    per_decode_seq_s=0.00025,
    per_decode_kv_token_s=3e-07,
)
"""Llama-3-8B-like on an H100."""


def truth_file(folder: Path) -> Path:
    """:data:`TRUTH` written as a profile file in ``folder``."""
    path = folder / "truth.json"
    fields = {name: getattr(TRUTH, name) for name in TRUTH.__dataclass_fields__}
    path.write_text(json.dumps({"format": PROFILE_FORMAT, "step_time": fields}))
    return path
