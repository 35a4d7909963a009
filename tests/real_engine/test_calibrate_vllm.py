"""``calibrate``'s probes against a real vLLM whose vocabulary is small (8,192 tokens).

Issue 14, defect 1: the probes drew token ids from 1000..29999 and vLLM refused them
(``Token id … is out of vocabulary``); now the ids come from the server's ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from headway.calibrate.plan import ProbePlan
from headway.calibrate.probe import run_probes
from headway.calibrate.profile import read_profile
from headway.cli import main
from headway.realengine.server import VllmServer

PLAN = ProbePlan(
    prefill_prompt_tokens=(16, 48, 96),
    prefill_output_tokens=3,
    rounds=1,
    decode_concurrency=(2,),
    decode_prompt_tokens=(32,),
    decode_output_tokens=12,
    shared_prefix_tokens=256,
    shared_concurrency=2,
)

WORKLOAD = {
    "name": "tiny-on-vllm",
    "duration_s": 20,
    "seed": 1,
    "classes": {"chat": {"input_tokens": 200, "output_tokens": 20}},
    "sources": [{"name": "users", "arrivals": {"process": "poisson", "rate_per_s": 0.5}}],
}


def test_probes_stay_inside_the_vocabulary_and_time_every_token(
    vllm_server: VllmServer,
) -> None:
    """Every probe is served; each stream's prompt and token times match vLLM's usage; the
    shared probe's requests find their prefix in vLLM's prefix cache."""
    hits_before = _prefix_cache_hits(vllm_server.url)
    info, results = asyncio.run(run_probes(vllm_server.url, PLAN))
    hits = _prefix_cache_hits(vllm_server.url) - hits_before
    assert info.model == "tiny" and info.max_model_len == 2048
    probed = sorted((r.shape.kind, r.shape.prompt_tokens) for r in results)
    # One round: the three prefill lengths, the decode shape and the shared one (a
    # 256-token prefix and 32 tokens of each request's own), between two reference
    # probes (the drift check's, at the decode shape).
    assert probed == [("decode", 32), ("prefill", 16), ("prefill", 48), ("prefill", 96),
                      ("reference", 32), ("reference", 32), ("shared", 288)]  # fmt: skip
    # Both of the shared probe's requests hit the whole prefix (two blocks of 128), which
    # the request before them left cached; no other probe hits anything.
    assert hits == 2 * 256, hits
    for result in results:
        for stream in result.streams:
            assert stream.usage_prompt_tokens == stream.prompt_tokens
            assert stream.usage_completion_tokens == result.shape.output_tokens
            # One content chunk a token, except where vLLM merged the deltas its API
            # server had not sent yet into one chunk (RequestOutputCollector.put in DELTA
            # mode): a loaded host made 20 chunks of a 21-token reference stream once.
            n = result.shape.output_tokens
            assert n - 2 <= len(stream.token_times_s) <= n
        # vLLM's own split of its TTFT around each probe: the engine core's part (queue
        # + prefill) and its API server's, both there, each a part of the whole.
        split = result.ttft_split
        assert split is not None, result.shape
        assert 0 < split.engine_ttft_mean_s < split.vllm_ttft_mean_s, (result.shape, split)
        assert 0 < split.frontend_s < split.vllm_ttft_mean_s, (result.shape, split)


def _prefix_cache_hits(url: str) -> float:
    """vLLM's ``vllm:prefix_cache_hits`` counter (tokens)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm:prefix_cache_hits"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def test_a_second_calibration_finds_no_prompt_in_the_prefix_cache(vllm_server: VllmServer) -> None:
    """Each run draws prompts of its own: vLLM caches the blocks of the prompts it served,
    and with the same prompts every run a second calibration's 1,536-token prefill took
    85 ms instead of 605 ms (as fast as a 128-token one) and the fit set
    ``per_prefill_token_s`` to 0. Uncached, the long prefill takes several times the short."""
    plan = ProbePlan(prefill_prompt_tokens=(128, 512, 1536), prefill_output_tokens=3, rounds=1,
                     decode_concurrency=(2,), decode_prompt_tokens=(32,),
                     decode_output_tokens=12)  # fmt: skip
    for run in range(2):
        _, results = asyncio.run(run_probes(vllm_server.url, plan))
        ttft = {
            r.shape.prompt_tokens: r.streams[0].token_times_s[0] - r.streams[0].sent_s
            for r in results
            if r.shape.kind == "prefill"
        }
        assert ttft[1536] > 3 * ttft[128], (run, ttft)


def test_calibrate_reads_the_engine_and_writes_a_cluster_for_simulate(
    vllm_server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 14, defects 3, 5 and 7 against the real engine: the KV pool comes from vLLM's
    ``vllm:cache_config_info``, the fit carries an interval for each coefficient and a
    drift check, the per-request cost is a step-time term the simulator adds, and the
    cluster file it writes runs ``simulate``."""
    out = tmp_path / "profile.json"
    args = ["calibrate", "--target", vllm_server.url, "--out", str(out), "--rounds", "3",
            "--prefill-prompt-tokens", "64,256,768", "--prefill-output-tokens", "6",
            "--decode-concurrency", "1,4,16", "--decode-prompt-tokens", "64,512",
            "--decode-output-tokens", "30", "--max-num-batched-tokens", "2048"]  # fmt: skip
    code = main(args)
    captured = capsys.readouterr()
    trusted = code == 0
    if not trusted:
        # The trust checks at their defaults (15% drift, 25% interval impact) hold on a
        # quiet host; this tiny model's ~12 ms CPU step on a shared two-core CI machine moves
        # 20-60% between probes a second apart. Then the refusal must be the designed one
        # (exit 1, each problem named, the profile kept for inspection only), and the rest
        # of the path is checked with limits no host fails (a neighbour's load moved the
        # reference step +859% once on CI; the checks themselves are tested above and in
        # tests/unit/emulate/test_calibrate_trust.py).
        assert code == 1 and "untrustworthy fit" in captured.err, captured.err
        assert "do not plan with it" in captured.err
        assert read_profile(out).fit.problems, "exit 1 without a problem in the profile"
        assert not (tmp_path / "profile.cluster.yaml").exists()
        code = main([*args, "--max-drift", "100", "--max-ci-impact", "100"])
        captured = capsys.readouterr()
    assert code == 0, captured.err
    profile = read_profile(out)
    settings = profile.engine_settings
    assert settings.block_size == 128 and settings.sources["block_size"] == "metrics"
    assert settings.num_gpu_blocks is not None and settings.num_gpu_blocks > 100
    assert settings.sources["num_gpu_blocks"] == "metrics"
    assert settings.max_num_batched_tokens == 2048
    # vLLM 0.32 admits a waiting request only when its whole sequence fits: its /version
    # names the release whose default that is, and the cluster file carries it.
    assert settings.reserve_full_isl is True and settings.sources["reserve_full_isl"] == "version"
    # A reference step per round and one at the end (4), less those a loaded host
    # disturbed (left out, as the fit leaves them out; calibrate warns when fewer than
    # two remain for the drift check), each an engine's step.
    steps_s = profile.fit.reference_step_s
    assert profile.fit.problems == [] and 1 <= len(steps_s) <= 4, steps_s
    assert all(s > 1e-4 for s in steps_s), steps_s
    for name, p in profile.fit.parameters.items():
        assert p.ci_low <= p.value <= p.ci_high, name
    step = profile.step_time
    assert step.per_prefill_seq_s >= 0.0
    # The API server's part of a lone request's TTFT, from vLLM's own split; shown.
    assert profile.fit.frontend_s is not None and profile.fit.frontend_s > 0
    assert "frontend (the API server, outside the engine core" in captured.out
    if trusted:
        # A decode step of the reference's 4 sequences is the fixed cost plus a little:
        # the fitted fixed cost is most of the measured step (a CPU step: ~10 ms to
        # ~0.3 s). Only a trusted fit says so: on two saturated cores the reference
        # steps (336 ms once) and the fit's other probes (32 ms overhead) were disturbed
        # unalike, which is what the trust checks refused.
        reference_s = statistics.median(steps_s)
        assert 0.3 * reference_s < step.overhead_s < 1.5 * reference_s
    # The shared probe ran (8 requests on one 1,024-token prefix, cached: vLLM said its
    # prefix caching is on) and gave samples, so its coefficient was fitted with the others
    # (its interval checked above). Its value is not bounded here: a calibration of the
    # benchmark's vLLM put the ratio at 0.46, 95% interval 0.18-0.90 (an ad-hoc
    # measurement, ~0.2); a trusted fit's interval may be as wide.
    assert "per_decode_shared_kv_token_s" in profile.fit.parameters

    cluster = yaml.safe_load((tmp_path / "profile.cluster.yaml").read_text(encoding="utf-8"))
    assert cluster["engine"]["block_size"] == 128
    assert cluster["engine"]["reserve_full_isl"] is True
    assert cluster["num_kv_blocks"] == settings.num_gpu_blocks
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    assert main(["simulate", str(workload), "--cluster", str(tmp_path / "profile.cluster.yaml"),
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["calls"] > 5
