"""The deployment references parse, are hardened, and configure a valid Lake.

They are not deployed here: this test reads them. Beyond their shape it feeds
each container's environment (secret paths replaced by real files) to the
same config loaders the servers run before binding, and runs the readiness
probe script against a real, authenticated server.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lake_metasrv.config import MetaConfig
from lake_query.config import QueryConfig
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import start_meta
from tools.lake_testing.tls import TestCA

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "kubernetes"
PROBE = DEPLOY / "health_probe.py"


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (main,) = workload["spec"]["template"]["spec"]["containers"]
    return main


def env_of(main: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in main["env"] if "value" in e}


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_containerfile_is_multi_stage_non_root_with_explicit_entrypoints() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, re.MULTILINE)
    assert {"build", "runtime", "metasrv", "query"} <= set(stages)
    runtime = text.split("AS runtime", 1)[1]
    assert re.search(r"^USER 10001:10001$", runtime, re.MULTILINE), "runtime must drop root"
    entrypoints = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    assert [json.loads(e) for e in entrypoints] == [
        ["/opt/lake/bin/lake", "meta"],
        ["/opt/lake/bin/lake", "query"],
    ]
    assert "COPY --from=build" in runtime  # only the built virtualenv crosses over
    # Bytecode compiled at build time, valid whatever mtimes COPY leaves: a read-only root
    # file system with PYTHONDONTWRITEBYTECODE would otherwise recompile at every start.
    build = text.split("AS build", 1)[1].split("AS runtime", 1)[0]
    assert re.search(
        r"python -m compileall -q --invalidation-mode unchecked-hash /opt/lake/lib$",
        build,
        re.MULTILINE,
    )
    assert not re.search(r"^(ADD|ENV|ARG) .*(SECRET|TOKEN|PASSWORD|KEY)=", text, re.MULTILINE)


@pytest.mark.parametrize(
    ("kind", "name"), [("StatefulSet", "lake-meta"), ("Deployment", "lake-query")]
)
def test_workloads_are_hardened_and_bounded(kind: str, name: str) -> None:
    workload = one(kind, name)
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for item in [*pod.get("initContainers", []), *pod["containers"]]:
        hardened = item["securityContext"]
        assert hardened["allowPrivilegeEscalation"] is False
        assert hardened["readOnlyRootFilesystem"] is True
        assert hardened["capabilities"]["drop"] == ["ALL"]
        for key in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(item["resources"][key])
        assert "@sha256:" in item["image"], "images are pinned by digest"
    main = container(workload)
    assert "command" not in main, "the image's explicit entrypoint starts the server"
    # Readiness is standard gRPC Health through the authenticated TLS probe.
    probe = main["readinessProbe"]["exec"]["command"]
    assert probe[-1] == "/opt/lake/bin/lake-health-probe"
    env = env_of(main)
    assert env["LAKE_PROBE_CA_FILE"]
    assert env["LAKE_PROBE_TOKEN_FILE"]
    # Graceful termination: the pod outlives preStop plus the whole drain window.
    pre_stop = int(main["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain_s = int(env["LAKE_SHUTDOWN_GRACE_MS"]) / 1000
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain_s + 5
    # Stateless: nothing but Secrets and scratch space.
    for volume in pod["volumes"]:
        assert set(volume) & {"secret", "emptyDir"}, volume
    assert "volumeClaimTemplates" not in workload["spec"]


@pytest.mark.parametrize(
    ("workload", "pdb"), [("lake-meta", "lake-meta"), ("lake-query", "lake-query")]
)
def test_disruption_budgets_cover_their_pods(workload: str, pdb: str) -> None:
    budget = one("PodDisruptionBudget", pdb)["spec"]
    selected = budget["selector"]["matchLabels"]
    pods = next(
        d
        for d in documents()
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == workload
    )
    labels = pods["spec"]["template"]["metadata"]["labels"]
    assert selected.items() <= labels.items()
    replicas = pods["spec"]["replicas"]
    assert replicas >= 2
    if "minAvailable" in budget:
        assert 0 < budget["minAvailable"] < replicas
    else:
        assert 0 < budget["maxUnavailable"] < replicas


def test_services_route_to_named_container_ports() -> None:
    for service in (d for d in documents() if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        pods = next(
            d
            for d in documents()
            if d["kind"] in ("Deployment", "StatefulSet")
            and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        )
        ports = {p["name"] for p in container(pods)["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    meta = one("StatefulSet", "lake-meta")
    assert meta["spec"]["serviceName"] == "lake-meta-peers"
    assert one("Service", "lake-meta-peers")["spec"]["clusterIP"] == "None"


def _materialize(env: dict[str, str], root: Path, names: dict[str, str]) -> dict[str, str]:
    """The container env with /run/lake-secrets/* pointing at real files in ``root``."""
    out = {}
    for key, value in env.items():
        if value.startswith("/run/lake-secrets/"):
            value = names[value.rsplit("/", 1)[1]]
        elif value == "REPLACE-bucket":  # a deployment input
            value = "embodied-data"
        out[key] = value.replace("$(POD_NAME)", "lake-meta-0")
    return out


@pytest.fixture
def secret_files(tmp_path: Path) -> dict[str, str]:
    ca = TestCA(tmp_path / "pki")
    meta_cert = ca.issue("lake-meta.internal", ip_addresses=())
    query_cert = ca.issue("lake-query.internal", ip_addresses=())

    def private(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o600)
        return str(path)

    token = "lk_" + secrets.token_urlsafe(24)
    bindings = [{"token": token, "principal_id": "ops", "tenant_id": "lake", "role": "admin"}]
    return {
        "principals.json": private("principals.json", json.dumps({"bindings": bindings})),
        "peer-token": private("peer-token", token),
        "metadata-token": private("metadata-token", token),
        "probe-token": private("probe-token", token),
        "ticket-keys.json": str(write_ticket_keys(tmp_path / "ticket-keys.json")),
        "ca.crt": str(ca.cert_file),
        "meta:tls.crt": str(meta_cert.cert_file),
        "meta:tls.key": str(meta_cert.key_file),
        "query:tls.crt": str(query_cert.cert_file),
        "query:tls.key": str(query_cert.key_file),
    }


def test_manifest_environments_pass_the_servers_own_validation(
    secret_files: dict[str, str], tmp_path: Path
) -> None:
    meta = container(one("StatefulSet", "lake-meta"))
    meta_env = _materialize(
        env_of(meta),
        tmp_path,
        {
            **secret_files,
            "tls.crt": secret_files["meta:tls.crt"],
            "tls.key": secret_files["meta:tls.key"],
        },
    )
    config = MetaConfig.load(data_dir=tmp_path / "unused", addr=meta["args"][1], env=meta_env)
    assert config.cloud is not None
    assert config.cloud.registry_table != config.cloud.storage.manifest_table
    assert config.advertise_url == "https://lake-meta-0.lake-meta-peers:50052"
    assert config.security.tls is not None
    assert config.peer_token is not None
    assert config.shutdown_grace_ms == 30_000

    query = container(one("Deployment", "lake-query"))
    query_env = _materialize(
        env_of(query),
        tmp_path,
        {
            **secret_files,
            "tls.crt": secret_files["query:tls.crt"],
            "tls.key": secret_files["query:tls.key"],
        },
    )
    assert "LAKE_DYNAMODB_TABLE" not in query_env, "Query never reads the registry table"
    loaded = QueryConfig.load(query["args"][1], query["args"][3], env=query_env)
    assert loaded.storage.manifest_table == config.cloud.storage.manifest_table
    assert loaded.metadata_token is not None


def test_the_readiness_probe_checks_authenticated_health(tmp_path: Path) -> None:
    token = "lk_" + secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    meta = start_meta(
        tmp_path / "data",
        tmp_path,
        env={"LAKE_AUTH_TOKEN_FILE": str(token_file)},
        probe_token=token,
    )
    try:
        env = {**os.environ, "LAKE_PROBE_ADDR": meta.addr}
        refused = subprocess.run(
            [sys.executable, str(PROBE)], env=env, capture_output=True, timeout=30
        )
        assert refused.returncode == 1
        assert b"UNAUTHENTICATED" in refused.stderr
        ready = subprocess.run(
            [sys.executable, str(PROBE)],
            env={**env, "LAKE_PROBE_TOKEN_FILE": str(token_file)},
            capture_output=True,
            timeout=30,
        )
        assert ready.returncode == 0, ready.stderr
        assert token.encode() not in ready.stderr + refused.stderr
    finally:
        meta.stop()
