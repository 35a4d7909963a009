"""Fit the roofline efficiency curves to public GPU timings; write headway/data/efficiency.json.

Usage (from the repository root)::

    python scripts/fit_efficiency.py [--calibration-dir ../shared/traces/calibration]
                                     [--output src/headway/data/efficiency.json]

What is fitted, from which measurements (all by least squares on log time, scipy):

- **GEMM** (``vidur_{a100,h100}_*_mlp.csv.gz``, Vidur's profiler): per row, the median times
  of the four GEMMs of one layer (QKV, output, gate+up, down) at a token count and TP
  degree. Model: :func:`headway.core.engine.roofline.gemm_time_s` — kernel overhead +
  p-norm of compute time (piecewise log-linear compute efficiency in the token count) and
  memory time (one memory efficiency). Fitted on the *sum* of the four GEMMs per row.
  One profile per GPU family (``a100`` from the two A100 files, ``h100`` from the two H100
  files) because the families differ (H100 streams weights closer to its peak bandwidth,
  A100 reaches a higher fraction of peak FLOP/s at small batches), plus a ``default``
  profile fitted jointly to all four files for GPUs without measurements.
- **element-wise kernels** (same files: input/post-attention layernorm, rotary, activation,
  residual add): memory efficiency and a per-kernel overhead, per profile.
- **attention** (``vidur_a100_Llama-2-7b-hf_attention_sample.csv.gz``, 81 FlashAttention
  timings): prefill compute efficiency, decode KV-read memory efficiency and a per-kernel
  overhead. A100 only; the same fractions are used for every profile.
- **all-reduce** (``vidur_h100_dgx_all_reduce.csv.gz``, NCCL on an 8×H100 DGX): ring
  bandwidth efficiency relative to half the marketed NVLink rate (one direction), and the
  latency floor, which the GPU catalog uses as ``interconnect_latency_s``. H100 only.

Nothing here reads the splitwise-sim measurements: those are the out-of-sample test of
``benchmarks/fidelity.py``.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.optimize
from scipy.special import expit

from headway.core.engine.catalog import ModelSpec
from headway.core.engine.efficiency import (
    ElementwiseEfficiency,
    GemmEfficiency,
    parse_efficiency_table,
)
from headway.core.engine.roofline import elementwise_bytes_per_layer, gemm_time_s

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CALIBRATION_DIR = ROOT.parent / "shared" / "traces" / "calibration"
DEFAULT_OUTPUT = ROOT / "src" / "headway" / "data" / "efficiency.json"

GEMM_FILES = {
    "a100": ("vidur_a100_Meta-Llama-3-8B_mlp.csv.gz", "vidur_a100_Meta-Llama-3-70B_mlp.csv.gz"),
    "h100": ("vidur_h100_Llama-2-7b-hf_mlp.csv.gz", "vidur_h100_Llama-2-70b-hf_mlp.csv.gz"),
}
ATTENTION_FILE = "vidur_a100_Llama-2-7b-hf_attention_sample.csv.gz"
ALL_REDUCE_FILE = "vidur_h100_dgx_all_reduce.csv.gz"

# Datasheet peaks the Vidur profiles ran on (serving-numbers.md 5.1; Vidur's own config
# uses 312 / 1000 TFLOP/s).
PEAKS = {
    "a100": (312e12, 2.039e12),
    "h100": (989.4e12, 3.35e12),
}
H100_NVLINK_BIDIRECTIONAL = 900e9

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = (
    "input_layernorm",
    "attn_rope",
    "post_attention_layernorm",
    "mlp_act",
    "add",
)
KNOT_TOKENS = (16.0, 64.0, 256.0, 1024.0, 4096.0)
"""Compute-efficiency knots: ×4 apart, inside the measured range of both GPU families."""

MAX_BLEND_EXPONENT = 16.0


@dataclass(frozen=True)
class Row:
    """One row of a Vidur mlp file: one layer at one token count and TP degree."""

    file: str
    family: str
    tokens: int
    tp: int
    model: ModelSpec
    gemm_shapes: tuple[tuple[float, float], ...]
    gemm_s: float
    elementwise_s: float


def _read_csv(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def load_mlp_rows(calibration_dir: Path) -> list[Row]:
    """All rows of the four Vidur mlp files, with their per-GPU GEMM shapes."""
    rows: list[Row] = []
    for family, files in GEMM_FILES.items():
        for name in files:
            for r in _read_csv(calibration_dir / name):
                h, heads = int(r["n_embd"]), int(r["n_head"])
                kv, ffn = int(r["n_kv_head"]), int(r["n_expanded_embd"])
                tp, tokens = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                gated = r["use_gated_mlp"] == "True"
                model = ModelSpec(
                    name=name, num_layers=1, hidden_size=h, num_attention_heads=heads,
                    num_kv_heads=kv, head_dim=h // heads, ffn_hidden_size=ffn,
                    vocab_size=int(r["vocab_size"]), gated_mlp=gated,
                )  # fmt: skip
                hd = h // heads
                q = heads / tp
                kvg = model.kv_heads_per_gpu(tp)
                shapes = (
                    (float(h), (q + 2 * kvg) * hd),
                    (q * hd, float(h)),
                    (float(h), (2.0 if gated else 1.0) * ffn / tp),
                    (ffn / tp, float(h)),
                )
                ms = 1e-3
                rows.append(
                    Row(
                        file=name,
                        family=family,
                        tokens=tokens,
                        tp=tp,
                        model=model,
                        gemm_shapes=shapes,
                        gemm_s=sum(float(r[f"time_stats.{op}.median"]) for op in GEMM_OPS) * ms,
                        elementwise_s=sum(
                            float(r[f"time_stats.{op}.median"]) for op in ELEMENTWISE_OPS
                        )
                        * ms,
                    )
                )
    return rows


# -- parametrisations (keep every efficiency in (0, 1] and the curve monotone in time) ------


def _sigmoid(x: np.ndarray | float) -> Any:
    return expit(np.asarray(x, dtype=float))


def gemm_params(theta: np.ndarray) -> GemmEfficiency:
    """Map free parameters to a valid :class:`GemmEfficiency`.

    The last knot's efficiency is a sigmoid; each earlier knot is the next one times a
    factor in [tokens ratio, 1], so the curve never falls with tokens and never rises
    faster than the token count, which keeps GEMM time non-decreasing in tokens.
    """
    k = len(KNOT_TOKENS)
    effs = [0.0] * k
    effs[-1] = float(_sigmoid(theta[0]))
    for i in range(k - 2, -1, -1):
        floor = KNOT_TOKENS[i] / KNOT_TOKENS[i + 1]
        effs[i] = effs[i + 1] * (floor + (1.0 - floor) * float(_sigmoid(theta[k - 1 - i])))
    return GemmEfficiency(
        memory_efficiency=float(_sigmoid(theta[k])),
        compute_tokens=KNOT_TOKENS,
        compute_efficiency=tuple(effs),
        blend_exponent=1.0 + (MAX_BLEND_EXPONENT - 1.0) * float(_sigmoid(theta[k + 1])),
        kernel_overhead_s=math.exp(float(theta[k + 2])) * 1e-6,
    )


GEMM_THETA0 = np.array([1.0, 2.0, 2.0, 2.0, 2.0, 1.5, -1.0, math.log(3.0)])


def gemm_sum_vectorised(eff: GemmEfficiency, data: GemmArrays) -> np.ndarray:
    """Per-row sum of the four GEMM times: a numpy mirror of ``gemm_time_s``."""
    m, k, n = data.tokens, data.k, data.n
    log_eff = np.interp(
        np.log(m), np.log(eff.compute_tokens), np.log(np.array(eff.compute_efficiency))
    )
    compute = 2.0 * m * k * n / (data.peak * np.exp(log_eff))
    memory = (2.0 * k * n + 2.0 * m * (k + n)) / (data.bandwidth * eff.memory_efficiency)
    top = np.maximum(compute, memory)
    p = eff.blend_exponent
    each = eff.kernel_overhead_s + top * ((compute / top) ** p + (memory / top) ** p) ** (1 / p)
    return np.bincount(data.row, weights=each, minlength=data.rows)


@dataclass(frozen=True)
class GemmArrays:
    """The GEMMs of a set of rows, flattened for vectorised evaluation."""

    tokens: np.ndarray
    k: np.ndarray
    n: np.ndarray
    peak: np.ndarray
    bandwidth: np.ndarray
    row: np.ndarray
    rows: int
    measured: np.ndarray


def gemm_arrays(rows: Sequence[Row]) -> GemmArrays:
    tokens, ks, ns, peaks, bws, idx = [], [], [], [], [], []
    for i, r in enumerate(rows):
        peak, bw = PEAKS[r.family]
        for k, n in r.gemm_shapes:
            tokens.append(float(r.tokens))
            ks.append(k)
            ns.append(n)
            peaks.append(peak)
            bws.append(bw)
            idx.append(i)
    return GemmArrays(
        tokens=np.array(tokens),
        k=np.array(ks),
        n=np.array(ns),
        peak=np.array(peaks),
        bandwidth=np.array(bws),
        row=np.array(idx),
        rows=len(rows),
        measured=np.array([r.gemm_s for r in rows]),
    )


def fit_gemm(rows: Sequence[Row]) -> GemmEfficiency:
    """Least squares on log(sum of the four GEMM times per row)."""
    data = gemm_arrays(rows)
    log_measured = np.log(data.measured)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.asarray(np.log(gemm_sum_vectorised(gemm_params(theta), data)) - log_measured)

    solution = scipy.optimize.least_squares(residuals, GEMM_THETA0, x_scale="jac")
    return gemm_params(solution.x)


def core_gemm_sum(eff: GemmEfficiency, row: Row) -> float:
    """The same sum through the core's scalar ``gemm_time_s`` (what the product uses)."""
    peak, bw = PEAKS[row.family]
    return sum(
        gemm_time_s(
            float(row.tokens), k, n, eff=eff, peak_flops_per_s=peak, bandwidth_bytes_per_s=bw
        )
        for k, n in row.gemm_shapes
    )


def fit_elementwise(rows: Sequence[Row]) -> ElementwiseEfficiency:
    """Least squares on log(sum of the element-wise kernel times per row)."""
    kernels = len(ELEMENTWISE_OPS)
    nbytes = np.array([elementwise_bytes_per_layer(r.model, r.tp, r.tokens) for r in rows])
    bandwidth = np.array([PEAKS[r.family][1] for r in rows])
    log_measured = np.log([r.elementwise_s for r in rows])

    def params(theta: np.ndarray) -> ElementwiseEfficiency:
        return ElementwiseEfficiency(
            memory_efficiency=float(_sigmoid(theta[0])),
            kernel_overhead_s=math.exp(float(theta[1])) * 1e-6,
            kernels_per_layer=kernels,
        )

    def residuals(theta: np.ndarray) -> np.ndarray:
        e = params(theta)
        predicted = kernels * e.kernel_overhead_s + nbytes / (bandwidth * e.memory_efficiency)
        return np.asarray(np.log(predicted) - log_measured)

    solution = scipy.optimize.least_squares(residuals, np.array([0.0, 1.0]))
    return params(solution.x)


def fit_attention(calibration_dir: Path) -> tuple[dict[str, float], float, int]:
    """Prefill compute efficiency, decode memory efficiency and kernel overhead (A100)."""
    model = ModelSpec(
        name="Llama-2-7B", num_layers=1, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=32, head_dim=128, ffn_hidden_size=11008, vocab_size=32000,
    )  # fmt: skip
    peak, bw = PEAKS["a100"]
    heads, hd = model.num_attention_heads, model.head_dim
    kv_bytes = model.kv_bytes_per_token()  # one layer: num_layers=1
    decode_bytes: list[float] = []
    decode_seq_heads: list[float] = []
    prefill_flops: list[float] = []
    prefill_bytes: list[float] = []
    measured: list[float] = []
    with gzip.open(calibration_dir / ATTENTION_FILE, "rt", encoding="utf-8") as fh:
        lines = [ln.strip() for ln in fh if ln.strip() and not ln.startswith("#")]
    for line in lines:
        kind, batch, chunk, kv, ms = line.split(",")
        b, c, k = int(batch), int(chunk), int(kv)
        if kind == "decode":
            decode_bytes.append(float(b * k * kv_bytes))
            decode_seq_heads.append(float(b * model.num_kv_heads))
            prefill_flops.append(0.0)
            prefill_bytes.append(0.0)
        else:
            pairs = c * k + c * (c + 1) // 2
            decode_bytes.append(0.0)
            decode_seq_heads.append(0.0)
            prefill_flops.append(4.0 * heads * hd * pairs)
            prefill_bytes.append(2.0 * c * 2 * (heads + model.num_kv_heads) * hd)
        measured.append(float(ms) * 1e-3)
    dbytes, pflops, pbytes = (
        np.array(decode_bytes),
        np.array(prefill_flops),
        np.array(prefill_bytes),
    )
    dseq_heads = np.array(decode_seq_heads)
    log_measured = np.log(measured)
    is_decode = dbytes > 0

    def params(theta: np.ndarray) -> dict[str, float]:
        return {
            "prefill_compute_efficiency": float(expit(theta[0])),
            "prefill_kernel_overhead_s": math.exp(float(theta[1])) * 1e-6,
            "decode_memory_efficiency": float(expit(theta[2])),
            "decode_kernel_overhead_s": math.exp(float(theta[3])) * 1e-6,
            "decode_per_seq_kv_head_s": math.exp(float(theta[4])) * 1e-6,
        }

    def predict(theta: np.ndarray) -> np.ndarray:
        p = params(theta)
        decode = (
            p["decode_kernel_overhead_s"]
            + p["decode_per_seq_kv_head_s"] * dseq_heads
            + dbytes / (bw * p["decode_memory_efficiency"])
        )
        prefill = p["prefill_kernel_overhead_s"] + np.maximum(
            pflops / (peak * p["prefill_compute_efficiency"]),
            pbytes / (bw * p["decode_memory_efficiency"]),
        )
        return np.asarray(np.where(is_decode, decode, prefill))

    theta0 = np.array([-1.0, math.log(10.0), 1.0, math.log(10.0), math.log(0.05)])
    solution = scipy.optimize.least_squares(lambda th: np.log(predict(th)) - log_measured, theta0)
    mape = float(np.mean(np.abs(predict(solution.x) / np.exp(log_measured) - 1.0)))
    return params(solution.x), mape, len(measured)


def fit_all_reduce(calibration_dir: Path) -> tuple[float, float, float, int]:
    """(bandwidth efficiency, latency_s, MAPE, rows) of a ring model of the NCCL timings."""
    sizes, workers, measured = [], [], []
    for r in _read_csv(calibration_dir / ALL_REDUCE_FILE):
        sizes.append(float(r["size"]))
        workers.append(float(r["num_workers"]))
        measured.append(float(r["time_stats.all_reduce.median"]) * 1e-3)
    size, w = np.array(sizes), np.array(workers)
    ring_bytes = 2.0 * (w - 1.0) / w * size
    log_measured = np.log(measured)

    def predict(theta: np.ndarray) -> np.ndarray:
        eff, latency = expit(theta[0]), math.exp(float(theta[1])) * 1e-6
        return np.asarray(latency + ring_bytes / (eff * H100_NVLINK_BIDIRECTIONAL / 2.0))

    solution = scipy.optimize.least_squares(
        lambda th: np.log(predict(th)) - log_measured, np.array([1.0, math.log(20.0)])
    )
    theta = solution.x
    mape = float(np.mean(np.abs(predict(theta) / np.exp(log_measured) - 1.0)))
    return float(expit(theta[0])), math.exp(float(theta[1])) * 1e-6, mape, len(measured)


def _round(value: Any, digits: int = 6) -> Any:
    """Round floats to ``digits`` significant digits, recursively (keeps the file small)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_round(v, digits) for v in value]
    return value


def _mape(pairs: Sequence[tuple[float, float]]) -> float:
    return float(np.mean([abs(p / m - 1.0) for p, m in pairs]))


def build_table(calibration_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Run every fit and return the JSON-ready efficiency table."""
    rows = load_mlp_rows(calibration_dir)
    log(f"read {len(rows)} GEMM rows from {len(GEMM_FILES) * 2} Vidur mlp files")
    attention, attention_mape, attention_rows = fit_attention(calibration_dir)
    log(f"attention: {attention} (MAPE {attention_mape:.3f} on {attention_rows} rows)")
    ar_eff, ar_latency, ar_mape, ar_rows = fit_all_reduce(calibration_dir)
    log(
        f"all-reduce: bandwidth efficiency {ar_eff:.3f}, latency {ar_latency * 1e6:.1f} us "
        f"(MAPE {ar_mape:.3f} on {ar_rows} rows)"
    )
    groups = {
        "a100": [r for r in rows if r.family == "a100"],
        "h100": [r for r in rows if r.family == "h100"],
        "default": list(rows),
    }
    profiles: dict[str, Any] = {}
    diagnostics: dict[str, Any] = {}
    for name, members in groups.items():
        gemm = fit_gemm(members)
        elementwise = fit_elementwise(members)
        # Check the vectorised mirror against the core's scalar function, row by row.
        core = [core_gemm_sum(gemm, r) for r in members]
        mirror = gemm_sum_vectorised(gemm, gemm_arrays(members))
        worst = float(np.max(np.abs(np.array(core) / mirror - 1.0)))
        if worst > 1e-9:
            raise AssertionError(f"numpy mirror disagrees with the core by {worst:.2e}")
        per_file = {
            f: _mape([(c, r.gemm_s) for c, r in zip(core, members, strict=True) if r.file == f])
            for f in sorted({r.file for r in members})
        }
        gemm_mape = _mape([(c, r.gemm_s) for c, r in zip(core, members, strict=True)])
        log(f"profile {name}: GEMM in-sample MAPE {gemm_mape:.4f} {per_file}")
        log(f"  gemm {gemm}")
        log(f"  elementwise {elementwise}")
        profiles[name] = {
            "gemm": {
                "memory_efficiency": gemm.memory_efficiency,
                "compute_tokens": list(gemm.compute_tokens),
                "compute_efficiency": list(gemm.compute_efficiency),
                "blend_exponent": gemm.blend_exponent,
                "kernel_overhead_s": gemm.kernel_overhead_s,
            },
            "elementwise": {
                "memory_efficiency": elementwise.memory_efficiency,
                "kernel_overhead_s": elementwise.kernel_overhead_s,
                "kernels_per_layer": elementwise.kernels_per_layer,
            },
            "attention": dict(attention),
            "all_reduce": {"bandwidth_efficiency": ar_eff},
        }
        diagnostics[name] = {
            "gemm_rows": len(members),
            "gemm_in_sample_mape": gemm_mape,
            "gemm_in_sample_mape_by_file": per_file,
        }
    diagnostics["attention"] = {"rows": attention_rows, "in_sample_mape": attention_mape}
    diagnostics["all_reduce"] = {
        "rows": ar_rows,
        "in_sample_mape": ar_mape,
        "latency_s": ar_latency,
        "note": "GpuSpec.interconnect_latency_s of the built-in catalog uses this latency",
    }
    files = [f for pair in GEMM_FILES.values() for f in pair] + [ATTENTION_FILE, ALL_REDUCE_FILE]
    table = {
        "comment": (
            "Roofline efficiency profiles for headway.core.engine.roofline. Produced by "
            "scripts/fit_efficiency.py (least squares on log time, scipy) from Vidur's public "
            "measurements in ../shared/traces/calibration/: "
            + ", ".join(files)
            + ". Profiles 'a100' and 'h100' are fitted to that family's GEMM and element-wise "
            "timings; 'default' to all four mlp files jointly. Attention fractions come from "
            "the A100 FlashAttention sample and the all-reduce efficiency from the H100 DGX "
            "NCCL timings, shared by all profiles. The splitwise-sim data is not used. "
            "Regenerate with the script; do not edit by hand."
        ),
        "version": 1,
        "profiles": _round(profiles),
        "fit": _round(diagnostics, 4),
    }
    parse_efficiency_table(table)  # the product's validation must accept what we write
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calibration-dir", type=Path, default=DEFAULT_CALIBRATION_DIR)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if not args.calibration_dir.is_dir():
        print(f"error: calibration directory {args.calibration_dir} not found", file=sys.stderr)
        return 2
    table = build_table(args.calibration_dir, lambda s: print(s, file=sys.stderr))
    args.output.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
