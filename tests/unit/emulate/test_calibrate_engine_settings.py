"""Calibrate reads the engine's KV-cache settings from vLLM's `vllm:cache_config_info` and
writes a cluster file that `simulate` reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from headway.calibrate.engine_settings import cache_config_labels, vllm_release, write_cluster
from headway.calibrate.profile import EngineSettings
from headway.sim.cluster import parse_cluster

# As vLLM 0.32 writes it: every CacheConfig field, str() of its value (lists included).
VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",calculate_kv_scales="False",\
enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",\
kv_cache_dtype_skip_layers="['a', 'b']",num_cpu_blocks="None",num_gpu_blocks="1365",\
num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""


def test_cache_config_info_labels_are_read() -> None:
    labels = cache_config_labels(VLLM_METRICS)
    assert labels == {"block_size": "128", "num_gpu_blocks": "1365",
                      "enable_prefix_caching": "True"}  # fmt: skip
    assert cache_config_labels("vllm:num_requests_running 0\n") == {}


def test_the_cluster_file_holds_what_the_engine_said(tmp_path: Path) -> None:
    sources = {"block_size": "metrics", "max_num_batched_tokens": "flag"}
    settings = EngineSettings(block_size=128, num_gpu_blocks=1365, enable_prefix_caching=True,
                              max_num_batched_tokens=2048, sources=sources)  # fmt: skip
    (tmp_path / "p").mkdir()
    profile = tmp_path / "p" / "profile.json"
    profile.write_text('{"format": "headway-profile/1", "step_time": {}}', encoding="utf-8")
    cluster = tmp_path / "cluster.yaml"
    missing = write_cluster(cluster, profile, settings, "http://127.0.0.1:8000")
    assert missing == ["max_num_seqs", "enable_chunked_prefill", "reserve_full_isl"]
    text = cluster.read_text(encoding="utf-8")
    assert "#   max_num_seqs: not exposed by the engine" in text
    data = yaml.safe_load(text)
    assert data["profile"] == "p/profile.json"
    spec = parse_cluster(data, str(cluster))
    assert spec.step_time == "profile" and spec.num_kv_blocks == 1365
    assert spec.engine.block_size == 128 and spec.engine.max_num_batched_tokens == 2048


def test_a_vllm_release_says_whether_a_waiting_request_must_fit_whole(tmp_path: Path) -> None:
    """vLLM from 0.32 admits a waiting request only when its whole sequence fits
    (``scheduler_reserve_full_isl``, on by default there): the cluster file carries it, so
    the simulator stops admitting prompts a small pool cannot hold (issue 14)."""
    assert vllm_release("0.32.0") == (0, 32) and vllm_release("0.32.1.dev3+cpu") == (0, 32)
    assert vllm_release("headway-emulate 0.9.0") is None and vllm_release(None) is None
    settings = EngineSettings(reserve_full_isl=True, sources={"reserve_full_isl": "version"})
    (tmp_path / "profile.json").write_text(
        '{"format": "headway-profile/1", "step_time": {}}', encoding="utf-8"
    )
    cluster = tmp_path / "cluster.yaml"
    missing = write_cluster(cluster, tmp_path / "profile.json", settings, "http://x")
    assert "reserve_full_isl" not in missing
    text = cluster.read_text(encoding="utf-8")
    assert "#   reserve_full_isl: from version" in text
    spec = parse_cluster(yaml.safe_load(text), str(cluster))
    assert spec.engine.reserve_full_isl is True
