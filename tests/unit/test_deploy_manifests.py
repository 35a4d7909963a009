"""The Kubernetes example in ``deploy/`` agrees with the code it deploys.

Each kustomization (``deploy/kubernetes``, the base with the emulator, and
``deploy/kubernetes-vllm``, the overlay with vLLM) is rendered here the way kustomize
does for the features it uses (resources, a strategic-merge patch of the ConfigMap's data,
``$patch: delete``), and checked against headway itself: the embedded ``gateway.yaml``
with the gateway's own config, pool and shared-budget parsers, every container's
arguments with ``headway``'s real argument parser, probe paths with the routes of the
real aiohttp apps. A failure names the file, the document and the field.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest
import yaml

from headway.cli import build_parser
from headway.core.errors import ConfigError
from headway.gateway.config import GatewayFileConfig, parse_config
from headway.gateway.pool import parse_pool_config
from headway.gateway.pooled import pool_config_data
from headway.gateway.shared import SharedBudgetsConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
STACKS = {"emulator": DEPLOY / "kubernetes", "vllm": DEPLOY / "kubernetes-vllm"}
"""Each kustomization directory, by the engines it deploys."""

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"})
PROBES = ("readinessProbe", "livenessProbe", "startupProbe")
VLLM_ROUTES = frozenset({"/health", "/ping", "/version", "/v1/models", "/metrics", "/load"})
"""GET routes of vLLM's OpenAI-compatible server (vllm/entrypoints/openai/api_server.py)."""
EMULATOR_DEFAULT_MODEL = "llama-3-8b"
"""``headway emulate``'s model without ``--model`` (docs/emulate.md)."""


# -- loading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    """One YAML document of a manifest file."""

    path: Path
    index: int
    body: dict[str, Any]
    part: str = ""
    """How to find it in its file when not as a document (an inline patch)."""

    @property
    def kind(self) -> str:
        return str(self.body.get("kind"))

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name"))

    def at(self, field: str) -> str:
        """Where a field is: file, document, field."""
        rel = self.path.relative_to(ROOT)
        part = self.part or f"document {self.index}"
        return f"{rel}, {part} ({self.kind} {self.name}), field {field}"


def load_docs(path: Path) -> list[Doc]:
    """The documents of one manifest file (empty documents skipped)."""
    with path.open(encoding="utf-8") as f:
        bodies = list(yaml.safe_load_all(f))
    docs = []
    for i, body in enumerate(bodies):
        if body is None:
            continue
        assert isinstance(body, dict), f"{path.relative_to(ROOT)}, document {i}: not a mapping"
        docs.append(Doc(path, i, body))
    return docs


def kustomization(directory: Path) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.relative_to(ROOT)}: not a mapping"
    return data


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge for what the patches here use: maps merge, the rest replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base.get(key), value) if key in base else value
        return out
    return patch


def _patches(directory: Path, k: dict[str, Any]) -> Iterator[Doc]:
    where = directory / "kustomization.yaml"
    for i, entry in enumerate(k.get("patches") or []):
        if "path" in entry:
            yield from load_docs(directory / entry["path"])
        else:
            assert "patch" in entry, f"{where.relative_to(ROOT)}: patches[{i}] has no path or patch"
            for body in yaml.safe_load_all(entry["patch"]):
                yield Doc(where, i, body, part=f"patches[{i}].patch")


def render(directory: Path) -> list[Doc]:
    """The documents ``kubectl kustomize directory`` yields (for the features used here).
    A patched document keeps the patch's file, so failures point where the text is."""
    k = kustomization(directory)
    docs: list[Doc] = []
    for entry in k.get("resources") or []:
        target = directory / entry
        docs.extend(render(target) if target.is_dir() else load_docs(target))
    for patch in _patches(directory, k):
        hits = [i for i, d in enumerate(docs) if (d.kind, d.name) == (patch.kind, patch.name)]
        assert len(hits) == 1, (
            f"{patch.at('metadata.name')}: the patch must match exactly one resource of "
            f"{directory.relative_to(ROOT)} (matches {len(hits)})"
        )
        if patch.body.get("$patch") == "delete":
            del docs[hits[0]]
        else:
            old = docs[hits[0]]
            docs[hits[0]] = Doc(patch.path, patch.index, _merge(old.body, patch.body))
    return docs


def _one(docs: list[Doc], what: str, where: Path) -> Doc:
    assert len(docs) == 1, f"{where.relative_to(ROOT)}: expected one {what}, found {len(docs)}"
    return docs[0]


# -- reading workloads -----------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """One container of a workload's pod template."""

    doc: Doc
    body: dict[str, Any]

    @property
    def field(self) -> str:
        return f"spec.template.spec.containers[{self.body.get('name')}]"

    def at(self, sub: str = "") -> str:
        return self.doc.at(self.field + (f".{sub}" if sub else ""))

    @property
    def image_repo(self) -> str:
        image = str(self.body.get("image", ""))
        return image.split("@")[0].rsplit(":", 1)[0].rsplit("/", 1)[-1]

    @property
    def is_headway(self) -> bool:
        return self.image_repo == "headway"

    def argv(self) -> list[str]:
        """``headway``'s arguments (the image's ENTRYPOINT is ``headway``)."""
        command = [str(c) for c in self.body.get("command") or []]
        args = [str(a) for a in self.body.get("args") or []]
        if command:
            assert Path(command[0]).name == "headway", (
                f"{self.at('command')}: a headway image runs `headway`, not {command[0]!r}"
            )
            command = command[1:]
        return command + args

    def ports(self) -> dict[str, int]:
        """containerPort by name (unnamed ports by their number)."""
        return {
            str(p.get("name", p["containerPort"])): int(p["containerPort"])
            for p in self.body.get("ports") or []
        }

    def resolve_port(self, port: object, field: str) -> int:
        """A probe's or a Service's port (a name or a number) as a containerPort."""
        ports = self.ports()
        if isinstance(port, str) and not port.isdigit():
            assert port in ports, (
                f"{field}: port {port!r} names no containerPort of {self.body.get('name')} "
                f"(ports: {ports})"
            )
            return ports[port]
        number = int(str(port))
        assert number in ports.values(), (
            f"{field}: port {number} is no containerPort of {self.body.get('name')} "
            f"(ports: {ports})"
        )
        return number

    def option(self, flag: str) -> str | None:
        """The value after ``flag`` (``--flag V`` or ``--flag=V``) in command + args."""
        words = [str(w) for w in (self.body.get("command") or []) + (self.body.get("args") or [])]
        for i, word in enumerate(words):
            if word == flag and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
        return None


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d.kind in WORKLOAD_KINDS]


def pod_spec(doc: Doc) -> dict[str, Any]:
    spec = (((doc.body.get("spec") or {}).get("template") or {}).get("spec")) or {}
    assert spec.get("containers"), f"{doc.at('spec.template.spec.containers')}: no containers"
    return dict(spec)


def pod_labels(doc: Doc) -> dict[str, str]:
    return dict((doc.body["spec"]["template"].get("metadata") or {}).get("labels") or {})


def containers(docs: list[Doc]) -> list[Container]:
    return [Container(d, c) for d in workloads(docs) for c in pod_spec(d)["containers"]]


def parse_headway(c: Container) -> argparse.Namespace:
    """The container's arguments through ``headway``'s real parser (no handler runs)."""
    argv = c.argv()
    assert argv, f"{c.at('args')}: no headway verb"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser(argv[0]).parse_args(argv)
    except SystemExit:
        pytest.fail(f"{c.at('args')}: `headway {shlex.join(argv)}` is rejected: {err.getvalue()}")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class Stack:
    """One rendered kustomization and its gateway."""

    directory: Path
    docs: list[Doc]

    def of_kind(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d.kind == kind]

    def named(self, kind: str, name: str) -> Doc | None:
        found = [d for d in self.docs if (d.kind, d.name) == (kind, name)]
        return found[0] if found else None

    def gateway(self) -> tuple[Container, argparse.Namespace]:
        found = [c for c in containers(self.docs) if c.is_headway and c.argv()[:1] == ["gateway"]]
        assert len(found) == 1, (
            f"{self.directory.relative_to(ROOT)}: expected one `headway gateway` container, "
            f"found {len(found)}"
        )
        return found[0], parse_headway(found[0])

    def config(self) -> tuple[Doc, GatewayFileConfig]:
        """The ConfigMap (or Secret) that the gateway's ``--config`` is mounted from, and
        the gateway.yaml in it, parsed by the gateway's own parser."""
        gw, args = self.gateway()
        path = str(args.config)
        mounts = [
            m
            for m in gw.body.get("volumeMounts") or []
            if path.startswith(str(m["mountPath"]).rstrip("/") + "/")
        ]
        assert mounts, f"{gw.at('volumeMounts')}: nothing is mounted where --config {path} is"
        mount = max(mounts, key=lambda m: len(str(m["mountPath"])))
        key = path[len(str(mount["mountPath"]).rstrip("/")) + 1 :]
        volumes = {v["name"]: v for v in pod_spec(gw.doc).get("volumes") or []}
        volume = volumes.get(mount["name"])
        assert volume is not None, f"{gw.doc.at('spec.template.spec.volumes')}: no {mount['name']}"
        if "configMap" in volume:
            kind, source = "ConfigMap", volume["configMap"]
            name = source["name"]
        else:
            assert "secret" in volume, (
                f"{gw.doc.at('spec.template.spec.volumes')}: {mount['name']} is no ConfigMap "
                "or Secret"
            )
            kind, source = "Secret", volume["secret"]
            name = source["secretName"]
        for item in source.get("items") or []:
            if item["path"] == key:
                key = item["key"]
        holder = self.named(kind, name)
        assert holder is not None, f"{gw.doc.at('spec.template.spec.volumes')}: no {kind} {name}"
        data = dict(holder.body.get("data") or {})
        if kind == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            data.update(holder.body.get("stringData") or {})
        assert key in data, (
            f"{holder.at('data')}: no key {key!r}, which --config {path} reads (keys: "
            f"{sorted(data)})"
        )
        try:
            loaded = yaml.safe_load(data[key])
            return holder, parse_config(loaded, holder.at(f"data[{key}]"))
        except (yaml.YAMLError, ConfigError) as error:
            pytest.fail(f"{holder.at(f'data[{key}]')}: the gateway rejects it: {error}")


@pytest.fixture(params=sorted(STACKS), scope="module")
def stack(request: pytest.FixtureRequest) -> Stack:
    directory = STACKS[request.param]
    return Stack(directory, render(directory))


def manifest_files() -> list[Path]:
    return sorted(
        p
        for directory in STACKS.values()
        for p in directory.glob("*.yaml")
        if p.name != "kustomization.yaml"
    )


# -- the tests -------------------------------------------------------------------------------


def test_every_document_has_apiversion_kind_and_name() -> None:
    files = manifest_files()
    assert len(files) >= 6, f"expected the manifests under deploy/, found {files}"
    count = 0
    for path in files:
        for doc in load_docs(path):
            count += 1
            for field in ("apiVersion", "kind"):
                value = doc.body.get(field)
                assert isinstance(value, str) and value, f"{doc.at(field)}: missing"
            name = (doc.body.get("metadata") or {}).get("name")
            assert isinstance(name, str) and name, f"{doc.at('metadata.name')}: missing"
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, (
                f"{doc.at('metadata.name')}: {name!r} is not a DNS-1123 label"
            )
    assert count >= 12


def test_rendered_resources_are_unique(stack: Stack) -> None:
    seen: dict[tuple[str, str], Doc] = {}
    for doc in stack.docs:
        key = (doc.kind, doc.name)
        assert key not in seen, f"{doc.at('metadata.name')}: also in {seen[key].at('kind')}"
        seen[key] = doc
    assert {"Deployment", "Service", "ConfigMap", "Secret"} <= {k for k, _ in seen}


@pytest.mark.parametrize("name", sorted(STACKS))
def test_kustomization_lists_exactly_the_files_present(name: str) -> None:
    directory = STACKS[name]
    k = kustomization(directory)
    where = (directory / "kustomization.yaml").relative_to(ROOT)
    assert k.get("apiVersion", "").startswith("kustomize.config.k8s.io/"), f"{where}: apiVersion"
    assert k.get("kind") == "Kustomization", f"{where}: kind"
    listed: list[str] = []
    for entry in k.get("resources") or []:
        target = (directory / entry).resolve()
        assert target.exists(), f"{where}, field resources: {entry} does not exist"
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), (
                f"{where}, field resources: {entry} is a directory without kustomization.yaml"
            )
        else:
            assert target.parent == directory, f"{where}, field resources: {entry} is elsewhere"
            listed.append(target.name)
    listed += [str(p["path"]) for p in k.get("patches") or [] if "path" in p]
    present = sorted(p.name for p in directory.glob("*.y*ml") if p.name != "kustomization.yaml")
    assert len(listed) == len(set(listed)), f"{where}: a file is listed twice: {listed}"
    assert sorted(listed) == present, (
        f"{where}, fields resources/patches: list {sorted(listed)}, files present {present} "
        f"(present but not listed: {sorted(set(present) - set(listed))}, "
        f"listed but absent: {sorted(set(listed) - set(present))})"
    )


def test_kustomize_renders_what_the_test_checks(stack: Stack) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the Python rendering is checked alone")
    result = subprocess.run(
        [kubectl, "kustomize", str(stack.directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    where = stack.directory.relative_to(ROOT)
    assert result.returncode == 0, f"kubectl kustomize {where} fails: {result.stderr}"
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    assert kinds == sorted((d.kind, d.name) for d in stack.docs), f"{where}: resources differ"
    ours = {(d.kind, d.name): d for d in stack.docs}
    for d in rendered:
        if d["kind"] in ("ConfigMap", "Secret"):
            doc = ours[(d["kind"], d["metadata"]["name"])]
            for field in ("data", "stringData"):
                assert d.get(field) == doc.body.get(field), f"{doc.at(field)}: kustomize differs"


def test_gateway_config_parses_with_the_gateways_parsers(stack: Stack) -> None:
    holder, config = stack.config()
    _, args = stack.gateway()
    where = holder.at("data[gateway.yaml]")
    assert config.pool is not None, f"{where}.pool: the example uses fingerprint probes"
    try:
        pool = parse_pool_config(pool_config_data(config), where + ".pool")
    except ConfigError as error:
        pytest.fail(f"{where}.pool: the gateway's pool rejects it: {error}")
    for up in pool.upstreams:
        assert pool.expected_fingerprint(up), f"{where}.upstreams[{up.url}]: no fingerprint"
    assert args.redis, f"{stack.gateway()[0].at('args')}: no --redis for the shared budgets"
    try:
        msgspec.convert({**(config.shared or {}), "redis_url": args.redis}, SharedBudgetsConfig)
    except (msgspec.ValidationError, ConfigError) as error:
        pytest.fail(f"{where}.shared (with --redis {args.redis}): rejected: {error}")
    if config.access_log not in (None, "-"):
        gw, _ = stack.gateway()
        writable = [
            m
            for m in gw.body.get("volumeMounts") or []
            if config.access_log.startswith(str(m["mountPath"]).rstrip("/") + "/")
            and not m.get("readOnly")
        ]
        assert writable, f"{where}.access_log: {config.access_log} is on no writable volume"


def test_admin_token_matches_the_secret(stack: Stack) -> None:
    holder, config = stack.config()
    where = holder.at("data[gateway.yaml].admin_token")
    assert config.admin_token, f"{where}: unset (the admin API, drains and reloads, is off)"
    secrets = [
        d
        for d in stack.of_kind("Secret")
        if (d.body.get("metadata") or {}).get("labels", {}).get("app.kubernetes.io/name")
        == "headway-gateway"
    ]
    secret = _one(secrets, "Secret labelled app.kubernetes.io/name: headway-gateway", holder.path)
    data = {k: base64.b64decode(v).decode() for k, v in (secret.body.get("data") or {}).items()}
    data.update(secret.body.get("stringData") or {})
    assert data.get("token") == config.admin_token, (
        f"{secret.at('stringData.token')}: differs from {where}; change both together"
    )


def test_container_arguments_parse_with_headways_parser(stack: Stack) -> None:
    headway = [c for c in containers(stack.docs) if c.is_headway]
    verbs = set()
    for c in headway:
        args = parse_headway(c)
        verbs.add(args.verb)
        assert callable(getattr(args, "handler", None)), f"{c.at('args')}: no handler"
        assert args.host in ("0.0.0.0", "::"), (
            f"{c.at('args')}: --host {args.host} is not reachable from other pods; use 0.0.0.0"
        )
        assert args.port in c.ports().values(), (
            f"{c.at('args')}: --port {args.port} is no containerPort ({c.ports()})"
        )
    expected = (
        {"gateway", "emulate"} if stack.named("StatefulSet", "headway-emulator") else {"gateway"}
    )
    assert verbs == expected, f"{stack.directory.relative_to(ROOT)}: headway verbs {verbs}"


def test_services_select_pods_and_ports_that_exist(stack: Stack) -> None:
    all_containers = containers(stack.docs)
    for w in workloads(stack.docs):
        match = (w.body["spec"].get("selector") or {}).get("matchLabels") or {}
        assert selects(match, pod_labels(w)), (
            f"{w.at('spec.selector.matchLabels')}: {match} does not match the pod labels "
            f"{pod_labels(w)}"
        )
    services = stack.of_kind("Service")
    assert services
    for svc in services:
        selector = dict(svc.body["spec"].get("selector") or {})
        matched = [w for w in workloads(stack.docs) if selects(selector, pod_labels(w))]
        assert matched, f"{svc.at('spec.selector')}: {selector} selects no workload's pods"
        pods = [c for c in all_containers if c.doc in matched]
        for i, port in enumerate(svc.body["spec"].get("ports") or []):
            target = port.get("targetPort", port["port"])
            field = svc.at(f"spec.ports[{i}].targetPort")
            named = isinstance(target, str) and not target.isdigit()
            hits = [
                c
                for c in pods
                if (target in c.ports() if named else int(target) in c.ports().values())
            ]
            assert hits, f"{field}: {target!r} is no containerPort of {[d.name for d in matched]}"
    for pdb in stack.of_kind("PodDisruptionBudget"):
        match = (pdb.body["spec"].get("selector") or {}).get("matchLabels") or {}
        assert any(selects(match, pod_labels(w)) for w in workloads(stack.docs)), (
            f"{pdb.at('spec.selector.matchLabels')}: {match} selects no workload's pods"
        )
    for sts in stack.of_kind("StatefulSet"):
        name = sts.body["spec"].get("serviceName")
        svc = stack.named("Service", str(name))
        assert svc is not None, f"{sts.at('spec.serviceName')}: no Service {name!r}"
        assert svc.body["spec"].get("clusterIP") == "None", (
            f"{svc.at('spec.clusterIP')}: the governing Service of {sts.name} must be headless"
        )
        assert selects(svc.body["spec"].get("selector") or {}, pod_labels(sts)), (
            f"{svc.at('spec.selector')}: does not select StatefulSet {sts.name}'s pods"
        )


def _served_routes(c: Container, config: GatewayFileConfig) -> frozenset[str]:
    """GET routes of the server that container runs."""
    if c.image_repo == "vllm-openai":
        return VLLM_ROUTES
    assert c.is_headway, f"{c.at('image')}: no known routes for HTTP probes of {c.image_repo}"
    args = parse_headway(c)
    if args.verb == "gateway":
        from headway.gateway.server import GatewayServer

        app = GatewayServer(_without_side_effects(config)).app
    else:
        assert args.verb == "emulate", f"{c.at('args')}: no routes known for {args.verb}"
        from headway.emulate.commands import build_server

        app = build_server(args)[0].app
    return frozenset(r.resource.canonical for r in app.router.routes() if r.method == "GET")


def _without_side_effects(config: GatewayFileConfig) -> GatewayFileConfig:
    """The config without side effects at construction (no access-log handler)."""
    return msgspec.structs.replace(config, access_log=None)


def test_probes_hit_routes_the_servers_serve(stack: Stack) -> None:
    _, config = stack.config()
    checked = 0
    for c in containers(stack.docs):
        if c.is_headway or c.image_repo.startswith("vllm"):
            assert c.body.get("readinessProbe"), f"{c.at('readinessProbe')}: missing"
        routes: frozenset[str] | None = None
        for probe_name in PROBES:
            probe = c.body.get(probe_name)
            if not probe:
                continue
            for handler in ("httpGet", "tcpSocket", "grpc"):
                if handler in probe:
                    c.resolve_port(probe[handler]["port"], c.at(f"{probe_name}.{handler}.port"))
            if "httpGet" in probe:
                routes = routes if routes is not None else _served_routes(c, config)
                path = str(probe["httpGet"].get("path", "/"))
                assert path in routes, (
                    f"{c.at(f'{probe_name}.httpGet.path')}: {path} is not served "
                    f"(GET routes: {sorted(routes)})"
                )
            checked += 1
    assert checked >= 5, (
        f"{stack.directory.relative_to(ROOT)}: only {checked} probes (gateway, engines, Redis)"
    )


def test_gateway_liveness_survives_unroutable_upstreams(stack: Stack) -> None:
    gw, _ = stack.gateway()
    probe = gw.body.get("livenessProbe")
    assert probe, f"{gw.at('livenessProbe')}: missing"
    assert not ("httpGet" in probe and probe["httpGet"].get("path") == "/health"), (
        f"{gw.at('livenessProbe.httpGet.path')}: /health answers 503 while no upstream is "
        "routable and while draining; a liveness probe on it restarts every gateway when the "
        "engines are down and kills a draining one. Use tcpSocket."
    )
    ready = gw.body.get("readinessProbe") or {}
    assert (ready.get("httpGet") or {}).get("path") == "/health", (
        f"{gw.at('readinessProbe.httpGet.path')}: readiness should follow /health (503 while "
        "draining or with no routable upstream)"
    )


def _prestop_sleep_s(c: Container) -> float:
    pre = ((c.body.get("lifecycle") or {}).get("preStop")) or {}
    assert pre, f"{c.at('lifecycle.preStop')}: missing (endpoints lag behind SIGTERM)"
    if "sleep" in pre:
        return float(pre["sleep"]["seconds"])
    command = [str(w) for w in (pre.get("exec") or {}).get("command") or []]
    text = " ".join(command)
    found = re.search(r"\bsleep\s+(\d+(?:\.\d+)?)\b", text)
    assert found, f"{c.at('lifecycle.preStop.exec.command')}: no `sleep N` in {command}"
    return float(found.group(1))


def test_grace_period_covers_prestop_and_drain(stack: Stack) -> None:
    gw, _ = stack.gateway()
    holder, config = stack.config()
    sleep_s = _prestop_sleep_s(gw)
    grace = pod_spec(gw.doc).get("terminationGracePeriodSeconds", 30)
    assert grace > sleep_s + config.shutdown_timeout_s, (
        f"{gw.doc.at('spec.template.spec.terminationGracePeriodSeconds')}: {grace} s must "
        f"exceed the preStop sleep ({sleep_s:g} s) plus shutdown_timeout_s "
        f"({config.shutdown_timeout_s:g} s, {holder.at('data[gateway.yaml]')}), or SIGKILL "
        "cuts the drain short"
    )
    assert sleep_s > 0, f"{gw.at('lifecycle.preStop')}: sleep 0 gives endpoints no time"


def test_redis_url_names_the_redis_service(stack: Stack) -> None:
    gw, args = stack.gateway()
    url = urlsplit(str(args.redis))
    field = gw.at("args --redis")
    assert url.scheme in ("redis", "rediss"), f"{field}: {args.redis} is not redis://"
    host = str(url.hostname)
    name = host.split(".")[0]
    svc = stack.named("Service", name)
    assert svc is not None, (
        f"{field}: host {host} names no Service (Services: "
        f"{[d.name for d in stack.of_kind('Service')]})"
    )
    port = url.port or 6379
    ports = [int(p["port"]) for p in svc.body["spec"].get("ports") or []]
    assert port in ports, f"{svc.at('spec.ports')}: {ports} lacks {port} of --redis {args.redis}"
    selected = [
        c
        for c in containers(stack.docs)
        if selects(svc.body["spec"].get("selector") or {}, pod_labels(c.doc))
    ]
    assert selected and all(c.image_repo == "redis" for c in selected), (
        f"{svc.at('spec.selector')}: Service {name} of --redis must select Redis pods "
        f"(selects {[c.body.get('image') for c in selected]})"
    )


def _engine_pod(stack: Stack, where: str, url: str) -> tuple[Doc, str, int]:
    """The StatefulSet, pod name and port an upstream URL names (pod.headless-service)."""
    parts = urlsplit(url)
    labels = str(parts.hostname).split(".")
    suffix = labels[3:]
    assert len(labels) >= 2 and suffix in ([], ["svc"], ["svc", "cluster", "local"]), (
        f"{where}: {url} is not POD.SERVICE[.NAMESPACE[.svc[.cluster.local]]]"
    )
    pod, service = labels[0], labels[1]
    svc = stack.named("Service", service)
    assert svc is not None, f"{where}: {url} names no Service {service!r}"
    assert svc.body["spec"].get("clusterIP") == "None", (
        f"{svc.at('spec.clusterIP')}: {url} needs a headless Service for per-pod names"
    )
    owners = [
        s for s in stack.of_kind("StatefulSet") if s.body["spec"].get("serviceName") == service
    ]
    sts = _one(owners, f"StatefulSet with serviceName {service}", svc.path)
    found = re.fullmatch(re.escape(sts.name) + r"-(\d+)", pod)
    replicas = int(sts.body["spec"].get("replicas", 1))
    assert found and int(found.group(1)) < replicas, (
        f"{where}: {pod} is no pod of StatefulSet {sts.name} ({replicas} replicas, "
        f"{sts.at('spec.replicas')})"
    )
    return sts, pod, parts.port or (443 if parts.scheme == "https" else 80)


def test_upstreams_are_the_engine_pods(stack: Stack) -> None:
    holder, config = stack.config()
    base = holder.at("data[gateway.yaml]")
    pods: dict[str, set[str]] = {}
    engines: dict[str, Doc] = {}
    for i, up in enumerate(config.upstreams):
        where = f"{base}.upstreams[{i}].url"
        sts, pod, port = _engine_pod(stack, where, up.url)
        pods.setdefault(sts.name, set()).add(pod)
        engines[sts.name] = sts
        engine = _one([c.doc for c in containers([sts])], "container", sts.path)
        c = Container(engine, pod_spec(engine)["containers"][0])
        svc = stack.named("Service", str(sts.body["spec"]["serviceName"]))
        assert svc is not None
        targets = [
            c.resolve_port(p.get("targetPort", p["port"]), svc.at("spec.ports"))
            for p in svc.body["spec"].get("ports") or []
        ]
        assert port in targets, (
            f"{where}: port {port} of {up.url} is not the engine's containerPort {targets} "
            "(a headless Service's names reach the pods directly)"
        )
        slots = up.slots or config.slots_per_upstream
        if c.is_headway:
            args = parse_headway(c)
            assert args.verb == "emulate", f"{c.at('args')}: the engine is not `emulate`"
            model = args.model or EMULATOR_DEFAULT_MODEL
            served = list(args.served_model_name) or [model]
            assert up.model == model, (
                f"{base}.upstreams[{i}].model: {up.model!r}, but {c.at('args')} emulates "
                f"{model!r}: the computed fingerprint would not match"
            )
            assert up.revision == args.revision, (
                f"{base}.upstreams[{i}].revision: {up.revision!r}, but {c.at('args')} serves "
                f"--revision {args.revision!r}"
            )
            max_seqs = args.max_num_seqs
        else:
            assert c.image_repo.startswith("vllm"), f"{c.at('image')}: unknown engine"
            assert up.model is None, (
                f"{base}.upstreams[{i}].model: {up.model!r} computes the emulator's "
                "fingerprint, never vLLM's; record the fingerprint instead"
            )
            revision = c.option("--revision")
            assert revision and up.revision == revision, (
                f"{base}.upstreams[{i}].revision: {up.revision!r}, but {c.at('args')} serves "
                f"--revision {revision!r}"
            )
            names = c.option("--served-model-name")
            served = names.split() if names else [str(c.body["args"][0])]
            seqs = c.option("--max-num-seqs")
            max_seqs = int(seqs) if seqs else None
        for model_name in config.models:
            assert model_name in served, (
                f"{base}.models: {model_name!r} is not served by {up.url} ({served}): 404s"
            )
        if up.served_model is not None:
            assert up.served_model in served, (
                f"{base}.upstreams[{i}].served_model: {up.served_model!r} not in {served}"
            )
        if max_seqs is not None:
            assert slots == max_seqs, (
                f"{base}.slots_per_upstream: {slots} slots for {up.url}, but the engine runs "
                f"--max-num-seqs {max_seqs} ({c.at('args')})"
            )
    for name, sts in engines.items():
        replicas = int(sts.body["spec"].get("replicas", 1))
        want = {f"{name}-{n}" for n in range(replicas)}
        assert pods[name] == want, (
            f"{base}.upstreams: lists {sorted(pods[name])}, but {sts.at('spec.replicas')} "
            f"runs {sorted(want)}: list one upstream per pod"
        )
    assert engines, f"{base}.upstreams: no engine StatefulSet"


def test_shared_budgets_expect_the_gateway_replicas(stack: Stack) -> None:
    holder, config = stack.config()
    gw, _ = stack.gateway()
    expected = int((config.shared or {}).get("expected_instances", 1))
    replicas = int(gw.doc.body["spec"].get("replicas", 1))
    assert expected == replicas, (
        f"{holder.at('data[gateway.yaml].shared.expected_instances')}: {expected}, but "
        f"{gw.doc.at('spec.replicas')} is {replicas}: local shares would be wrong while "
        "Redis is down"
    )


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _image_uid() -> int:
    users = [rest for word, rest in _dockerfile() if word == "USER"]
    assert users, "deploy/Dockerfile: no USER line (the image would run as root)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"deploy/Dockerfile, USER {users[-1]}: root"
    assert user.isdigit(), (
        f"deploy/Dockerfile, USER {users[-1]}: use a numeric uid, so that Kubernetes' "
        "runAsNonRoot can verify it"
    )
    return int(user)


def test_dockerfile_builds_a_non_root_headway_image() -> None:
    lines = _dockerfile()
    froms = [rest for word, rest in lines if word == "FROM"]
    assert froms and froms[-1].split()[0] == "python:3.11-slim", (
        f"deploy/Dockerfile, FROM: the runtime stage is {froms[-1:]}, not python:3.11-slim"
    )
    assert _image_uid() != 0
    entry = [rest for word, rest in lines if word == "ENTRYPOINT"]
    assert entry, "deploy/Dockerfile: no ENTRYPOINT"
    assert json.loads(entry[-1]) == ["headway"], (
        f"deploy/Dockerfile, ENTRYPOINT {entry[-1]}: the manifests pass `headway` arguments"
    )
    runs = " ".join(rest for word, rest in lines if word == "RUN")
    assert re.search(r"pip install (\S+ )*\.(\s|$)", runs), "deploy/Dockerfile: no `pip install .`"
    copied = " ".join(rest for word, rest in lines if word == "COPY")
    needed = ("pyproject.toml", "README.md", "src")
    for name in needed:
        assert name in copied, f"deploy/Dockerfile, COPY: {name} (pip install . needs it)"
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore")
    if ignore.is_file():
        rules = [r.strip() for r in ignore.read_text(encoding="utf-8").splitlines()]
        if "*" in rules:
            for name in needed:
                assert f"!{name}" in rules, (
                    f"deploy/Dockerfile.dockerignore: ignores everything but not !{name}"
                )


def test_pods_are_hardened_and_sized(stack: Stack) -> None:
    uid = _image_uid()
    for c in containers(stack.docs):
        resources = c.body.get("resources") or {}
        for part in ("requests", "limits"):
            for what in ("cpu", "memory"):
                assert what in (resources.get(part) or {}), (
                    f"{c.at(f'resources.{part}.{what}')}: missing"
                )
        if c.image_repo.startswith("vllm"):
            assert (resources.get("limits") or {}).get("nvidia.com/gpu"), (
                f"{c.at('resources.limits')}: vLLM needs nvidia.com/gpu"
            )
        if not c.is_headway:
            continue
        pod_ctx = pod_spec(c.doc).get("securityContext") or {}
        ctx = c.body.get("securityContext") or {}
        merged = {**pod_ctx, **ctx}
        assert merged.get("runAsNonRoot") is True, f"{c.at('securityContext.runAsNonRoot')}"
        assert ctx.get("readOnlyRootFilesystem") is True, (
            f"{c.at('securityContext.readOnlyRootFilesystem')}: not true"
        )
        assert ctx.get("allowPrivilegeEscalation") is False, (
            f"{c.at('securityContext.allowPrivilegeEscalation')}: not false"
        )
        if "runAsUser" in merged:
            assert merged["runAsUser"] == uid, (
                f"{c.at('securityContext.runAsUser')}: {merged['runAsUser']}, but "
                f"deploy/Dockerfile's USER is {uid}"
            )


def test_headway_image_matches_the_build_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    images = set()
    for directory in STACKS.values():
        for c in containers(render(directory)):
            if c.is_headway:
                images.add(str(c.body["image"]))
                assert f"-t {c.body['image']} " in readme, (
                    f"{c.at('image')}: deploy/README.md does not build {c.body['image']}"
                )
    assert images == {f"headway:{project['project']['version']}"}, (
        f"headway containers use {images}; the project is {project['project']['version']}"
    )


def test_failure_messages_name_file_document_and_field() -> None:
    path = DEPLOY / "kubernetes" / "x.yaml"
    doc = Doc(path, 2, {"kind": "Service", "metadata": {"name": "svc"}})
    assert doc.at("spec.ports") == (
        "deploy/kubernetes/x.yaml, document 2 (Service svc), field spec.ports"
    )
    bad = Stack(
        DEPLOY / "kubernetes",
        [
            Doc(path, 0, {"kind": "Service", "metadata": {"name": "svc"},
                          "spec": {"selector": {"app": "none"}, "ports": [{"port": 1}]}}),
        ],
    )  # fmt: skip
    with pytest.raises(AssertionError, match=r"x\.yaml, document 0 \(Service svc\), field spec"):
        test_services_select_pods_and_ports_that_exist(bad)
