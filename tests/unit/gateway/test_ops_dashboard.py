"""``docs/grafana-gateway.json`` queries only what the gateway's ``/metrics`` exposes: the
metric names come from a gateway's own exposition text (with a pool and shared budgets
configured, so every optional family is rendered)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from headway.gateway.config import parse_config
from headway.gateway.server import GatewayServer

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana-gateway.json"

PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "by", "without", "rate", "irate", "increase",
    "deriv", "histogram_quantile", "clamp_min", "clamp_max", "and", "or", "unless", "on",
    "ignoring", "group_left", "group_right", "topk", "bottomk", "abs", "e",
}  # fmt: skip


def _exposed() -> set[str]:
    config = parse_config(
        {
            "upstreams": [{"url": "http://127.0.0.1:1", "revision": "r1", "model": "llama-3-8b"}],
            "pool": {},
        }
    )
    server = GatewayServer(config, redis_url="redis://127.0.0.1:1")  # not started
    assert server.pool is not None
    text = server.metrics.render().decode()
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _names(expr: str) -> set[str]:
    """Identifiers of ``expr`` that are neither PromQL words, labels nor literals."""
    text = re.sub(r'"[^"]*"', "", expr)  # label values
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    text = re.sub(r"\{[^}]*\}", "", text)  # matchers
    text = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "", text)  # numbers
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return words - PROMQL_WORDS


def test_dashboard_queries_only_exposed_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = _exprs(dashboard)
    assert len(exprs) >= 20
    exposed = _exposed()
    used: set[str] = set()
    for expr in exprs:
        names = _names(expr)
        assert names, expr
        assert names <= exposed, (expr, names - exposed)
        used |= names
    # the brief's panels: queues, sheds, Retry-After, cancellations, retries and budget,
    # upstream TTFT, goodput, upstream states, shared-budget health
    for name in (
        "headway_gateway_queue_depth_requests", "headway_gateway_tenant_queue_depth_requests",
        "headway_gateway_admissions_total", "headway_gateway_sheds_total",
        "headway_gateway_retry_after_issued_total", "headway_gateway_cancellations_total",
        "headway_gateway_upstream_retries_total", "headway_gateway_retry_budget_left",
        "headway_gateway_upstream_ttft_seconds_bucket", "headway_gateway_goodput_requests_total",
        "headway_gateway_upstream_state", "headway_gateway_shared_budgets_healthy",
    ):  # fmt: skip
        assert name in used, name
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(titles) == len(set(titles))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_name_filter_catches_a_typo() -> None:
    assert _names('sum by (le) (rate(headway_gateway_nope_total{tenant="a"}[5m]))') == {
        "headway_gateway_nope_total"
    }
