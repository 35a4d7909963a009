"""Policy configs: documented fields, typos rejected, errors that name field, value and fix;
and the shed reasons each have a meaning."""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from headway.core.errors import ConfigError
from headway.core.policy._checks import PolicyConfigError
from headway.core.policy.admission import AdmissionConfig, TenantLimits
from headway.core.policy.deadlines import DeadlineConfig
from headway.core.policy.decisions import SHED_REASON_MEANINGS, Shed, ShedReason
from headway.core.policy.fallback import FallbackConfig
from headway.core.policy.queues import BandConfig, QueueConfig
from headway.core.policy.retries import RetryConfig

ROOT = Path(__file__).resolve().parents[3]
CONFIGS: list[type[msgspec.Struct]] = [
    AdmissionConfig,
    TenantLimits,
    QueueConfig,
    BandConfig,
    RetryConfig,
    DeadlineConfig,
    FallbackConfig,
]


def _documented_fields(cls: type) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    return {
        prev.target.id
        for prev, node in itertools.pairwise(body)
        if isinstance(prev, ast.AnnAssign)
        and isinstance(prev.target, ast.Name)
        and isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and node.value.value.strip()
    }


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_has_an_attribute_docstring(cls: type[msgspec.Struct]) -> None:
    assert set(cls.__struct_fields__) == _documented_fields(cls)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_is_in_the_policy_doc(cls: type[msgspec.Struct]) -> None:
    doc = (ROOT / "docs" / "overload-policies.md").read_text(encoding="utf-8")
    missing = [f for f in cls.__struct_fields__ if f"`{f}`" not in doc]
    assert not missing, f"docs/overload-policies.md lacks {cls.__name__} fields {missing}"


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_unknown_keys_are_rejected(cls: type[msgspec.Struct]) -> None:
    data: dict[str, Any] = {"max_queued_requests": 1} if cls is BandConfig else {}
    msgspec.convert(data, cls)  # the defaults are valid
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({**data, "typo_s": 1}, cls)


BAD = [
    (AdmissionConfig, {"kv_reserve_fraction": 1.5}, "admission.kv_reserve_fraction", "1.5"),
    (AdmissionConfig, {"block_size": 0}, "admission.block_size", "0"),
    (AdmissionConfig, {"max_retry_after_s": 0.0}, "admission.max_retry_after_s", "0.0"),
    (TenantLimits, {"max_concurrency": 0}, "max_concurrency", "0"),
    (TenantLimits, {"token_rate_per_s": -1.0}, "token_rate_per_s", "-1.0"),
    (QueueConfig, {"background_max_share": 2.0}, "queues.background_max_share", "2.0"),
    (QueueConfig, {"tenant_weights": {"acme": 0.0}}, "queues.tenant_weights.acme", "0.0"),
    (QueueConfig, {"critical_reserved_slots": -1}, "queues.critical_reserved_slots", "-1"),
    (BandConfig, {"max_queued_requests": -1}, "max_queued_requests", "-1"),
    (BandConfig, {"max_queued_requests": 1, "max_wait_s": 0.0}, "max_wait_s", "0.0"),
    (RetryConfig, {"backoff_base_s": 2.0, "backoff_max_s": 1.0}, "retries.backoff_max_s", "1.0"),
    (RetryConfig, {"budget_ratio": 1.5}, "retries.budget_ratio", "1.5"),
    (RetryConfig, {"max_attempts": 0}, "retries.max_attempts", "0"),
    (
        DeadlineConfig,
        {"default_budget_s": 90.0, "max_budget_s": 60.0},
        "deadlines.default_budget_s",
        "90.0",
    ),
    (FallbackConfig, {"max_hops": 0}, "fallback.max_hops", "0"),
]


@pytest.mark.parametrize(("cls", "fields", "name", "value"), BAD)
def test_a_bad_value_names_the_field_the_value_and_a_fix(
    cls: type[msgspec.Struct], fields: dict[str, Any], name: str, value: str
) -> None:
    with pytest.raises(PolicyConfigError) as info:
        cls(**fields)
    message = str(info.value)
    assert name in message
    assert re.search(rf"\(got '?{re.escape(value)}'?\): \S.+", message), message
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)


def test_decoding_a_bad_value_gives_the_key_path() -> None:
    class Tree(msgspec.Struct, kw_only=True):
        queues: QueueConfig = QueueConfig()

    with pytest.raises(msgspec.ValidationError, match=r"background_max_share.*at `\$\.queues`"):
        msgspec.convert({"queues": {"background_max_share": 3}}, Tree)


def test_every_shed_reason_has_a_meaning() -> None:
    assert set(SHED_REASON_MEANINGS) == set(ShedReason)
    assert all(len(r.meaning) > 20 for r in ShedReason)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_shed_retry_after_is_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ValueError, match="retry_after_s"):
        Shed(ShedReason.QUEUE_FULL, bad)
