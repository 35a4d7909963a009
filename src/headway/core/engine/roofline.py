"""A roofline step-time model with measured efficiency curves.

The time of one engine step is the sum of per-operator-group times; each group costs

    kernel overhead + blend(FLOPs / (peak × eff_compute), bytes / (bandwidth × eff_memory))

where ``blend`` is a p-norm (``(a**p + b**p) ** (1/p)``, at least ``max(a, b)``) that lets
the memory- and compute-bound regimes meet smoothly, as measured GEMMs do near the ridge
point. The groups, per transformer layer and summed over the layers:

- **linear layers**: the QKV, output, gate/up and down projections as GEMMs over the
  step's tokens (FLOPs ``2 · tokens · K · N``, bytes = weights + activations). A mixture of
  experts reads the weights of the experts its tokens touch and runs each of them over its
  share of the tokens;
- **element-wise kernels**: norms, rotary embedding, activation and residual add,
  memory-bound (bytes per token from the shape, plus a launch overhead per kernel);
- **prefill attention**: ``4 · heads · head_dim`` FLOPs per query-key pair
  (:attr:`BatchShape.prefill_attention_pairs`), split over tensor parallelism;
- **decode attention**: reads ``decode_kv_tokens`` × KV bytes per token per GPU, plus a
  fixed cost per (sequence, KV head) block and per kernel; it is memory-bound and exactly
  linear in the KV tokens, so decode-only steps are affine
  (:meth:`RooflineStepTime.decode_step_affine`);
- **tensor-parallel all-reduce**: two per layer of ``tokens × hidden × 2`` bytes, as a ring:
  ``latency + 2 (tp − 1) / tp × bytes / (efficiency × per-direction bandwidth)``;

plus the LM head (a GEMM over one row per sequence in the step) and a per-step engine
overhead (a constant plus a cost per sequence: scheduling, sampling, detokenization).

**Host launches.** The GPU runs only what the host has launched. Without CUDA graphs an
engine launches each layer's kernels one by one from Python, and the step takes
``max(GPU time, launch time)``: the host runs ahead of a busy GPU, and a small batch's
GPU waits on the host (the floor under which a decode step no longer falls when tensor
parallelism halves each GPU's weights). ``cuda_graphs`` says how the engine runs:
``full`` (vLLM V1's default, ``FULL_AND_PIECEWISE``: a decode-only batch replays one
graph, a mixed batch piecewise graphs with attention launched between them), ``piecewise``
or ``eager`` (``--enforce-eager``, and engines before vLLM 0.2.6, which added CUDA
graphs); a batch of more tokens than ``cuda_graph_max_tokens`` runs eager in every mode.
The launch costs per layer (:data:`EAGER_LAUNCH_PER_LAYER_S`,
:data:`PIECEWISE_LAUNCH_PER_LAYER_S`) come from published engine measurements, cited
where they are defined; nothing is fitted to the timings ``benchmarks/fidelity.py``
tests against. The launch time hides under the step's GPU time that does not grow with
the KV tokens, so that decode-only steps stay exactly affine in them (a step whose KV
reads alone outlast the launches is predicted a little slow, never fast).

The efficiencies are not guesses: ``scripts/fit_efficiency.py`` fits them by least squares
on log time to measured kernels (Vidur's GEMM and element-wise timings per GPU family,
Vidur's FlashAttention sample and NCCL all-reduce timings) and writes
``headway/data/efficiency.json``;
:func:`~headway.core.engine.efficiency.parse_efficiency_table` turns that file's parsed
content into an :class:`~headway.core.engine.efficiency.EfficiencyTable`. Every
efficiency is at most 1 and every overhead is at least 0, so no prediction is faster
than the pure roofline (:meth:`roofline_bound_s`). Every term is non-decreasing in each
batch sum, so more work never takes less time.

Usage (a driver loads the shipped table; the core never reads files)::

    gpu = get_gpu("h100")
    step = RooflineStepTime(model=get_model("llama-3-70b"), gpu=gpu, tensor_parallel=4,
                            efficiency=headway.data.load_efficiency_table().profile_for(gpu))
    step.step_time_s(BatchShape(num_decode_seqs=64, decode_kv_tokens=64 * 2000))

Known limits: one fitted curve per GPU family (GEMM kernel choice makes real timings
step-shaped in the token count; the curve is smooth), attention efficiency measured on A100
only, no overlap of communication with compute, and the per-step engine overhead is an
assumption to be replaced by ``headway calibrate`` for a real engine. The launch costs
are one figure per mode for every host CPU: a slower host launches more slowly
(``benchmarks/fidelity.py`` prints the errors per GPU, tensor parallelism and mode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from headway.core.engine.catalog import GpuSpec, ModelSpec
from headway.core.engine.efficiency import EfficiencyProfile, GemmEfficiency
from headway.core.engine.steptime import BatchShape
from headway.core.pickling import reduce_by_fields

__all__ = [
    "ACTIVATION_BYTES",
    "CUDA_GRAPH_MODES",
    "DEFAULT_CUDA_GRAPH_MAX_TOKENS",
    "DEFAULT_PER_SEQ_OVERHEAD_S",
    "DEFAULT_STEP_OVERHEAD_S",
    "EAGER_LAUNCH_PER_LAYER_S",
    "PIECEWISE_LAUNCH_PER_LAYER_S",
    "CudaGraphMode",
    "RooflineStepTime",
    "StepBreakdown",
    "all_reduce_time_s",
    "blend",
    "elementwise_bytes_per_layer",
    "gemm_time_s",
]

ACTIVATION_BYTES: Final = 2
"""Bytes per activation element (BF16), also for FP8-weight models."""

DEFAULT_STEP_OVERHEAD_S: Final = 1.0e-3
"""Assumed fixed engine cost per step (scheduling, input preparation, sampling launch).

Not fitted: CUDA-graph engines with overlapped scheduling (vLLM V1, SGLang, TensorRT-LLM)
spend well under a few milliseconds per step on the host. Replace it with a calibrated
value (``headway calibrate``) for a particular engine."""

DEFAULT_PER_SEQ_OVERHEAD_S: Final = 2.0e-6
"""Assumed engine cost per sequence in a step (sampling, output processing); not fitted."""

CudaGraphMode = Literal["full", "piecewise", "eager"]
"""How the engine launches a step's kernels (see the module docstring)."""

CUDA_GRAPH_MODES: Final = get_args(CudaGraphMode)

EAGER_LAUNCH_PER_LAYER_S: Final = 2.3e-4
"""Host seconds to launch one transformer layer's kernels from Python without CUDA graphs.

Source: vLLM PR #51167 (github.com/vllm-project/vllm/pull/51167, 2026-08; one H200,
Voxtral-Mini-4B-Realtime, whose decode step runs 26 decoder and 32 encoder layers):
at batch 1, eager 60.5 tokens/s (16.5 ms a step), full CUDA graph 201.1 tokens/s
(4.97 ms). A launch-bound eager step is the launch time plus the host work the graph
keeps, so the launches take (16.5 − 4.97) ms plus the GPU time they hide (about
1.8 ms: 8.7 GB of BF16 weights at 4.8 TB/s): 13.3 ms over 58 layers, 0.23 ms a layer.
Cross-checks, not used: xLLM PR #713 (C++ launches, Qwen3-0.6B, 28 layers) saves 1.48 ms
a step at concurrency 1 but only 0.74 ms at 30, as a launch floor hidden under a larger
GPU time does; vLLM PR #1440 (2023, Llama-2-7B, batch 1) 12.0 ms eager vs 10.5 ms."""

PIECEWISE_LAUNCH_PER_LAYER_S: Final = 1.55e-5
"""Host seconds a layer adds with piecewise CUDA graphs (attention launched between the
graphed pieces). Source: vLLM PR #51167, as :data:`EAGER_LAUNCH_PER_LAYER_S`: batch 1,
piecewise 170.4 tokens/s (5.87 ms) vs full graphs 201.1 tokens/s (4.97 ms), 0.90 ms over
58 layers. vLLM PR #16072 (full CUDA graphs in V1) reports 7% lower TPOT for Qwen2.5-1.5B
than piecewise: the same order."""

DEFAULT_CUDA_GRAPH_MAX_TOKENS: Final = 512
"""The largest batch (in tokens) vLLM V1 captures graphs for: its default
``max_cudagraph_capture_size`` is ``min(2 × max_num_seqs, 512)``; a larger batch (a long
prefill chunk) runs eager."""


# -- kernel-level cost functions ----------------------------------------------------------------


def blend(a: float, b: float, p: float) -> float:
    """p-norm of two non-negative times: ``max(a, b) <= blend <= a + b`` for ``p >= 1``."""
    m = a if a > b else b
    if m <= 0.0:
        return 0.0
    return m * float(((a / m) ** p + (b / m) ** p) ** (1.0 / p))


def gemm_time_s(
    tokens: float,
    k: float,
    n: float,
    *,
    eff: GemmEfficiency,
    peak_flops_per_s: float,
    bandwidth_bytes_per_s: float,
    weight_bytes: float = 2.0,
    count: float = 1.0,
) -> float:
    """Seconds for ``count`` GEMMs ``[tokens × k] @ [k × n]`` launched as one kernel.

    FLOPs ``2 · tokens · k · n``; bytes ``weight_bytes · k · n`` of weights plus
    ``ACTIVATION_BYTES · tokens · (k + n)`` of activations. ``count`` > 1 models the experts
    of a mixture-of-experts layer (each over ``tokens`` of its own).
    """
    if tokens <= 0 or count <= 0:
        return 0.0
    flops = 2.0 * tokens * k * n
    nbytes = weight_bytes * k * n + ACTIVATION_BYTES * tokens * (k + n)
    compute_s = flops / (peak_flops_per_s * eff.compute_efficiency_at(tokens))
    memory_s = nbytes / (bandwidth_bytes_per_s * eff.memory_efficiency)
    return eff.kernel_overhead_s + count * blend(compute_s, memory_s, eff.blend_exponent)


def elementwise_bytes_per_layer(model: ModelSpec, tensor_parallel: int, tokens: float) -> float:
    """HBM bytes the element-wise kernels of one layer move for ``tokens`` tokens.

    Two norms (read and write ``hidden``), rotary embedding on q and k (read and write),
    the activation (read gate and up, write one; read and write when not gated) over the
    active experts' width, and a residual add (read two, write one ``hidden``).
    """
    h = model.hidden_size
    qk_width = (
        model.num_attention_heads / tensor_parallel + model.kv_heads_per_gpu(tensor_parallel)
    ) * model.head_dim
    ffn = model.num_active_experts * model.ffn_hidden_size / tensor_parallel
    act = (3.0 if model.gated_mlp else 2.0) * ffn
    per_token = 4.0 * h + 2.0 * qk_width + act + 3.0 * h
    return ACTIVATION_BYTES * tokens * per_token


def all_reduce_time_s(
    message_bytes: float,
    tensor_parallel: int,
    *,
    bandwidth_bytes_per_s: float,
    latency_s: float,
    efficiency: float,
) -> float:
    """Ring all-reduce of ``message_bytes`` over ``tensor_parallel`` GPUs.

    ``bandwidth_bytes_per_s`` is the marketed bidirectional per-GPU rate; a ring sends and
    receives ``2 (tp − 1) / tp × bytes`` per GPU at the per-direction rate (half of it).
    """
    if tensor_parallel <= 1 or message_bytes <= 0:
        return 0.0
    ring_bytes = 2.0 * (tensor_parallel - 1) / tensor_parallel * message_bytes
    return latency_s + ring_bytes / (efficiency * bandwidth_bytes_per_s / 2.0)


# -- the step-time model ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Seconds per operator group of one step (all layers together)."""

    linear_s: float
    lm_head_s: float
    elementwise_s: float
    prefill_attention_s: float
    decode_attention_s: float
    all_reduce_s: float
    overhead_s: float
    launch_s: float = 0.0
    """Host launch time the GPU waits for: the launches beyond the GPU time they hide."""

    @property
    def total_s(self) -> float:
        """The step time: the sum of the groups."""
        return (
            self.linear_s
            + self.lm_head_s
            + self.elementwise_s
            + self.prefill_attention_s
            + self.decode_attention_s
            + self.all_reduce_s
            + self.overhead_s
            + self.launch_s
        )

    def __reduce__(self) -> tuple[Callable[[], StepBreakdown], tuple[()]]:
        """Pickle by calling the class (compiled, the default refuses a frozen class)."""
        return reduce_by_fields(self)


_ROOFLINE_ARGUMENTS: Final = (
    "model", "gpu", "efficiency", "tensor_parallel", "step_overhead_s", "per_seq_overhead_s",
    "cuda_graphs", "cuda_graph_max_tokens",
)  # fmt: skip
"""What :class:`RooflineStepTime` is built from (its other fields derive from these)."""


@dataclass(slots=True, init=False, unsafe_hash=True)
class RooflineStepTime:
    """Step times of ``model`` on ``tensor_parallel`` GPUs of type ``gpu``.

    Implements :class:`~headway.core.engine.steptime.StepTimeModel`. ``efficiency`` is the
    GPU's fitted profile (``EfficiencyTable.profile_for(gpu)``). Weights and KV cache use
    ``model.dtype_bytes``; with 1-byte (FP8) weights the GPU's FP8 peak applies. A value:
    its fields are never reassigned (a plain dataclass with its own ``__init__``, as
    :class:`~headway.core.engine.steptime.BatchShape` explains).
    """

    model: ModelSpec
    gpu: GpuSpec
    efficiency: EfficiencyProfile
    tensor_parallel: int
    step_overhead_s: float
    """Fixed engine cost of every non-empty step."""
    per_seq_overhead_s: float
    """Engine cost per sequence (prefill or decode) in a step."""
    cuda_graphs: str
    """How the engine launches a step's kernels (:data:`CudaGraphMode`)."""
    cuda_graph_max_tokens: int
    """Batches of more tokens than this run eager whatever ``cuda_graphs`` says."""

    _peak: float = field(repr=False)
    _bw: float = field(repr=False)
    _shapes: tuple[tuple[float, float], ...] = field(repr=False)
    _expert_shapes: tuple[tuple[float, float], ...] = field(repr=False)
    _per_kv_token_s: float = field(repr=False)
    _token_cache: dict[int, float] = field(repr=False, compare=False, hash=False)
    _rows_cache: dict[int, float] = field(repr=False, compare=False, hash=False)
    _fixed_cache: dict[tuple[int, int, int, int], float] = field(
        repr=False, compare=False, hash=False
    )

    def __init__(
        self,
        *,
        model: ModelSpec,
        gpu: GpuSpec,
        efficiency: EfficiencyProfile,
        tensor_parallel: int = 1,
        step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
        per_seq_overhead_s: float = DEFAULT_PER_SEQ_OVERHEAD_S,
        cuda_graphs: str = "full",
        cuda_graph_max_tokens: int = DEFAULT_CUDA_GRAPH_MAX_TOKENS,
    ) -> None:
        tp = tensor_parallel
        if cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(
                f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)} (got {cuda_graphs!r})"
            )
        if cuda_graph_max_tokens < 0:
            raise ValueError(
                f"cuda_graph_max_tokens must be >= 0 (got {cuda_graph_max_tokens!r}); vLLM "
                f"captures up to {DEFAULT_CUDA_GRAPH_MAX_TOKENS}"
            )
        if tp < 1 or tp % 1:
            raise ValueError(f"tensor_parallel must be an integer >= 1 (got {tp!r})")
        if model.num_attention_heads % tp != 0:
            raise ValueError(
                f"tensor_parallel={tp} must divide the {model.num_attention_heads} "
                f"attention heads of {model.name}; use a divisor such as 1, 2, 4 or 8"
            )
        for name, value in (
            ("step_overhead_s", step_overhead_s),
            ("per_seq_overhead_s", per_seq_overhead_s),
        ):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"RooflineStepTime.{name} must be in [0, 1) s (got {value!r})")
        self.model = model
        self.gpu = gpu
        self.efficiency = efficiency
        self.tensor_parallel = tp
        self.step_overhead_s = step_overhead_s
        self.per_seq_overhead_s = per_seq_overhead_s
        self.cuda_graphs = cuda_graphs
        self.cuda_graph_max_tokens = cuda_graph_max_tokens
        m = model
        h, hd = float(m.hidden_size), float(m.head_dim)
        q_heads = m.num_attention_heads / tp
        kv_heads = float(m.kv_heads_per_gpu(tp))
        mlp_in = (2.0 if m.gated_mlp else 1.0) * m.ffn_hidden_size / tp
        mlp_out = m.ffn_hidden_size / tp
        attn_shapes = ((h, (q_heads + 2.0 * kv_heads) * hd), (q_heads * hd, h))
        mlp_shapes = ((h, mlp_in), (mlp_out, h))
        peak = gpu.peak_flops_per_s(m.dtype_bytes)
        bw = gpu.hbm_bandwidth_bytes_per_s
        att = efficiency.attention
        kv_bytes_per_token_layer = 2.0 * kv_heads * hd * m.dtype_bytes
        kv_flops_per_token_layer = 4.0 * q_heads * hd
        per_kv_layer = max(
            kv_bytes_per_token_layer / (bw * att.decode_memory_efficiency),
            kv_flops_per_token_layer / (peak * att.prefill_compute_efficiency),
        )
        self._peak = peak
        self._bw = bw
        if m.num_experts > 1:
            self._shapes = attn_shapes
            self._expert_shapes = mlp_shapes
        else:
            self._shapes = attn_shapes + mlp_shapes
            self._expert_shapes = ()
        self._per_kv_token_s = m.num_layers * per_kv_layer
        self._token_cache = {}
        self._rows_cache = {}
        self._fixed_cache = {}

    def __reduce__(self) -> tuple[Callable[[], RooflineStepTime], tuple[()]]:
        """Pickle by the ``__init__`` arguments; the derived values are computed again."""
        return reduce_by_fields(self, _ROOFLINE_ARGUMENTS)

    # -- the StepTimeModel protocol ------------------------------------------------------

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds the step takes; 0 for an empty batch."""
        if batch.is_empty:
            return 0.0
        return self._fixed_time_s(batch) + self._per_kv_token_s * batch.decode_kv_tokens

    def decode_step_affine(self, num_seqs: int, shared_kv_tokens: int = 0) -> tuple[float, float]:
        """``(base_s, per_kv_token_s)`` of decode-only steps of ``num_seqs`` sequences.

        ``step_time_s`` computes decode-only steps as exactly ``base + per * kv``. Shared
        KV tokens cost what the others do: a GPU engine without cascade attention (vLLM
        0.32 has none) reads each sequence's blocks from HBM, and what its L2 cache saves
        on shared ones has not been measured here.
        """
        if num_seqs <= 0:
            return (0.0, 0.0)
        return (self._fixed_time_s(BatchShape(num_decode_seqs=num_seqs)), self._per_kv_token_s)

    # -- diagnostics ---------------------------------------------------------------------

    def breakdown(self, batch: BatchShape) -> StepBreakdown:
        """The step time split by operator group (sums to :meth:`step_time_s`, up to rounding)."""
        if batch.is_empty:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        n = batch.num_tokens
        layers = self.model.num_layers
        linear, elementwise, all_reduce = self._per_layer_token_parts(n)
        decode = (
            layers * self._decode_attention_fixed_layer_s(batch.num_decode_seqs)
            + self._per_kv_token_s * batch.decode_kv_tokens
        )
        unhidden = self.launch_time_s(batch) - self._gpu_fixed_s(batch)
        return StepBreakdown(
            linear_s=layers * linear,
            lm_head_s=self._lm_head_s(batch.num_decode_seqs + batch.num_prefill_seqs),
            elementwise_s=layers * elementwise,
            prefill_attention_s=layers * self._prefill_attention_layer_s(batch),
            decode_attention_s=decode,
            all_reduce_s=layers * all_reduce,
            overhead_s=self._overhead_s(batch),
            launch_s=max(0.0, unhidden),
        )

    def launch_time_s(self, batch: BatchShape) -> float:
        """Host seconds to launch the step's kernels (module docstring, host launches)."""
        if batch.is_empty:
            return 0.0
        mode = self.cuda_graphs
        if batch.num_tokens > self.cuda_graph_max_tokens:
            mode = "eager"
        elif mode == "full" and batch.num_prefill_tokens == 0:
            return 0.0  # one graph replay
        per_layer = EAGER_LAUNCH_PER_LAYER_S if mode == "eager" else PIECEWISE_LAUNCH_PER_LAYER_S
        return self.model.num_layers * per_layer

    def roofline_bound_s(self, batch: BatchShape) -> float:
        """The pure roofline: ``max(FLOPs / peak, HBM bytes / bandwidth)`` of the step.

        FLOPs of all GEMMs and attention; bytes of the weights read and the KV cache read
        (activations, overheads and communication left out). No prediction is below it.
        """
        if batch.is_empty:
            return 0.0
        m, tp = self.model, self.tensor_parallel
        n = float(batch.num_tokens)
        flops = 0.0
        weight_elems = 0.0
        for k, nn in self._shapes:
            flops += 2.0 * n * k * nn
            weight_elems += k * nn
        if self._expert_shapes:
            touched = self._experts_touched(n)
            for k, nn in self._expert_shapes:
                flops += 2.0 * n * m.num_active_experts * k * nn
                weight_elems += touched * k * nn
        q_heads = m.num_attention_heads / tp
        flops += (
            4.0 * q_heads * m.head_dim * (batch.prefill_attention_pairs + batch.decode_kv_tokens)
        )
        kv_bytes = (
            2.0 * m.kv_heads_per_gpu(tp) * m.head_dim * m.dtype_bytes * batch.decode_kv_tokens
        )
        nbytes = weight_elems * m.dtype_bytes + kv_bytes
        flops *= m.num_layers
        nbytes *= m.num_layers
        rows = batch.num_decode_seqs + batch.num_prefill_seqs
        lm_n = m.vocab_size / tp
        flops += 2.0 * rows * m.hidden_size * lm_n
        if rows > 0:
            nbytes += m.hidden_size * lm_n * m.dtype_bytes
        return max(flops / self._peak, nbytes / self._bw)

    # -- internals ------------------------------------------------------------------------

    def _fixed_time_s(self, batch: BatchShape) -> float:
        """Everything except the decode-attention time proportional to the KV tokens: a
        function of the batch's other sums, memoised on them."""
        key = (
            batch.num_prefill_tokens,
            batch.prefill_attention_pairs,
            batch.num_prefill_seqs,
            batch.num_decode_seqs,
        )
        cached = self._fixed_cache.get(key)
        if cached is None:
            cached = self._compute_fixed_time_s(batch)
            if len(self._fixed_cache) >= 65536:
                self._fixed_cache.clear()
            self._fixed_cache[key] = cached
        return cached

    def _compute_fixed_time_s(self, batch: BatchShape) -> float:
        gpu_s = self._gpu_fixed_s(batch)
        launch_s = self.launch_time_s(batch)
        return (gpu_s if gpu_s >= launch_s else launch_s) + self._overhead_s(batch)

    def _gpu_fixed_s(self, batch: BatchShape) -> float:
        """GPU seconds of the step that do not grow with the decode KV tokens."""
        layers = self.model.num_layers
        per_layer = self._token_time_layer_s(batch.num_tokens)
        per_layer += self._prefill_attention_layer_s(batch)
        per_layer += self._decode_attention_fixed_layer_s(batch.num_decode_seqs)
        rows = batch.num_decode_seqs + batch.num_prefill_seqs
        return layers * per_layer + self._lm_head_s(rows)

    def _overhead_s(self, batch: BatchShape) -> float:
        seqs = batch.num_decode_seqs + batch.num_prefill_seqs
        return self.step_overhead_s + self.per_seq_overhead_s * seqs

    def _token_time_layer_s(self, tokens: int) -> float:
        """Per-layer time that depends only on the step's token count (memoised)."""
        cached = self._token_cache.get(tokens)
        if cached is None:
            linear, elementwise, all_reduce = self._per_layer_token_parts(tokens)
            cached = linear + elementwise + all_reduce
            if len(self._token_cache) >= 65536:
                self._token_cache.clear()
            self._token_cache[tokens] = cached
        return cached

    def _per_layer_token_parts(self, tokens: int) -> tuple[float, float, float]:
        """(linear, element-wise, all-reduce) seconds of one layer for ``tokens`` tokens."""
        if tokens <= 0:
            return (0.0, 0.0, 0.0)
        m, tp, eff = self.model, self.tensor_parallel, self.efficiency
        n = float(tokens)
        linear = sum(self._gemm_s(n, k, nn) for k, nn in self._shapes)
        if self._expert_shapes:
            touched = self._experts_touched(n)
            per_expert = n * m.num_active_experts / touched
            linear += self._gemm_s(n, float(m.hidden_size), float(m.num_experts))
            linear += sum(
                self._gemm_s(per_expert, k, nn, count=touched) for k, nn in self._expert_shapes
            )
        ew = eff.elementwise
        elementwise = ew.kernels_per_layer * ew.kernel_overhead_s + elementwise_bytes_per_layer(
            m, tp, n
        ) / (self._bw * ew.memory_efficiency)
        all_reduce = 2.0 * all_reduce_time_s(
            n * m.hidden_size * ACTIVATION_BYTES,
            tp,
            bandwidth_bytes_per_s=self.gpu.interconnect_bandwidth_bytes_per_s,
            latency_s=self.gpu.interconnect_latency_s,
            efficiency=eff.all_reduce.bandwidth_efficiency,
        )
        return (linear, elementwise, all_reduce)

    def _gemm_s(self, tokens: float, k: float, n: float, count: float = 1.0) -> float:
        return gemm_time_s(
            tokens,
            k,
            n,
            eff=self.efficiency.gemm,
            peak_flops_per_s=self._peak,
            bandwidth_bytes_per_s=self._bw,
            weight_bytes=float(self.model.dtype_bytes),
            count=count,
        )

    def _experts_touched(self, tokens: float) -> float:
        """Expected distinct experts hit by ``tokens`` tokens routed uniformly (≥ active)."""
        m = self.model
        e, k = float(m.num_experts), float(m.num_active_experts)
        touched = e * (1.0 - (1.0 - k / e) ** tokens) if k < e else e
        return max(touched, min(k, e))

    def _decode_attention_fixed_layer_s(self, num_decode_seqs: int) -> float:
        """Decode attention time of one layer that does not grow with the KV tokens."""
        if num_decode_seqs <= 0:
            return 0.0
        att = self.efficiency.attention
        kv_heads = self.model.kv_heads_per_gpu(self.tensor_parallel)
        return att.decode_kernel_overhead_s + att.decode_per_seq_kv_head_s * num_decode_seqs * (
            kv_heads
        )

    def _prefill_attention_layer_s(self, batch: BatchShape) -> float:
        if batch.prefill_attention_pairs <= 0 or batch.num_prefill_tokens <= 0:
            return 0.0
        m, tp, att = self.model, self.tensor_parallel, self.efficiency.attention
        q_heads = m.num_attention_heads / tp
        kv_heads = m.kv_heads_per_gpu(tp)
        flops = 4.0 * q_heads * m.head_dim * batch.prefill_attention_pairs
        # Q, K, V read and the output written for the chunk's tokens.
        nbytes = (
            ACTIVATION_BYTES * batch.num_prefill_tokens * 2.0 * (q_heads + kv_heads) * (m.head_dim)
        )
        return att.prefill_kernel_overhead_s + max(
            flops / (self._peak * att.prefill_compute_efficiency),
            nbytes / (self._bw * att.decode_memory_efficiency),
        )

    def _lm_head_s(self, rows: int) -> float:
        """The LM head over one row per sequence in the step (memoised)."""
        if rows <= 0:
            return 0.0
        cached = self._rows_cache.get(rows)
        if cached is None:
            m = self.model
            cached = self._gemm_s(
                float(rows), float(m.hidden_size), m.vocab_size / self.tensor_parallel
            )
            if len(self._rows_cache) >= 65536:
                self._rows_cache.clear()
            self._rows_cache[rows] = cached
        return cached
