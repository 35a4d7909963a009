"""The KEDA example in ``deploy/keda`` agrees with the gateway: its Prometheus query reads
the gateway's desired-replicas gauge (the catalog's name and label), it scales the
StatefulSet the base deploys, its bounds and polling are the gateway autoscaler's, and the
``autoscaler:`` block it goes with is one the gateway's config parser accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from headway.gateway.config import parse_config
from headway.metrics_catalog import DESIRED_REPLICAS_METRIC, GATEWAY_AUTOSCALER

ROOT = Path(__file__).resolve().parents[2]
KEDA = ROOT / "deploy" / "keda"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _base_gateway_yaml() -> dict[str, Any]:
    configmap = _yaml(ROOT / "deploy" / "kubernetes" / "gateway-configmap.yaml")
    data: dict[str, Any] = yaml.safe_load(configmap["data"]["gateway.yaml"])
    return data


def test_the_scaled_object_scales_the_emulators_on_the_gateways_gauge() -> None:
    scaled = _yaml(KEDA / "scaledobject.yaml")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    target = scaled["spec"]["scaleTargetRef"]
    emulators = [
        d
        for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "emulator.yaml").read_text())
        if d and d["kind"] == target["kind"]
    ]
    assert [d["metadata"]["name"] for d in emulators] == [target["name"]]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    assert f"{DESIRED_REPLICAS_METRIC}{{" in query
    assert GATEWAY_AUTOSCALER[0].labels == ("pool",) and 'pool="default"' in query
    assert trigger["metadata"]["threshold"] == "1"  # desired = ceil(value / 1)


def test_its_bounds_are_the_gateway_autoscalers_and_the_gateway_accepts_it() -> None:
    scaled = _yaml(KEDA / "scaledobject.yaml")["spec"]
    block = _yaml(KEDA / "gateway-autoscaler.yaml")
    config = parse_config({**_base_gateway_yaml(), **block}, "gateway.yaml + autoscaler")
    scaler = config.autoscaler
    assert scaler is not None and scaler.kind == "predictive"
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (
        scaler.min_replicas,
        scaler.max_replicas,
    )
    assert scaled["pollingInterval"] == scaler.evaluation_interval_s
