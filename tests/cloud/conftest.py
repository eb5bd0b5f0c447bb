"""A cloud-mode Lake for tests: real ``lake meta``/``lake query`` on SeaweedFS + dynalite.

Secured like a deployment: the Metasrv set serves TLS (certificate for
``lake-meta.test`` only, so every client must name it), authenticates
bearer tokens from a principal map (admin, the Query fleet's
``query_service``, the followers' ``metadata_peer``), and followers forward
to the leader with ``LAKE_PEER_AUTH_TOKEN_FILE``/``LAKE_PEER_CA_FILE``/
``LAKE_PEER_SERVER_NAME``. Query replicas reach the set through a TCP
balancer (the Kubernetes Service) and serve SDK users by bearer token.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

import lake_sdk
from lake_core.metaclient import MetaClient
from tests.cloud.balancer import Balancer
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import LakeProcess, free_port, start_together
from tools.lake_testing.tls import TestCA

META_NAME = "lake-meta.test"
REGISTRY_TABLE = "lake_registry"
MANIFEST_TABLE = "lake_manifests"
TABLE_PREFIX = "warehouse/tables"
USER_NAMESPACES = ["robots"]


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _principals(path: Path, bindings: list[dict[str, Any]]) -> Path:
    return _private(path, json.dumps({"bindings": bindings}))


@dataclass
class CloudLake:
    root: Path
    s3: SeaweedS3
    bucket: str
    dynamo: Dynalite
    ca: TestCA
    tokens: dict[str, str]
    meta_env: dict[str, str]
    query_env: dict[str, str]
    metas: list[LakeProcess] = field(default_factory=list)
    queries: list[LakeProcess] = field(default_factory=list)
    balancer: Balancer | None = None

    # -- processes ---------------------------------------------------------------

    def start_meta(self, env: dict[str, str] | None = None, port: int | None = None) -> LakeProcess:
        return self._meta_process(env, port).start()

    def _meta_process(
        self, env: dict[str, str] | None = None, port: int | None = None
    ) -> LakeProcess:
        addr = f"127.0.0.1:{port or free_port()}"
        name = f"meta-{addr.rsplit(':', 1)[1]}"
        process = LakeProcess(
            name,
            ["-m", "lake_metasrv", "--addr", addr],
            addr,
            self.root / f"{name}.log",
            {**self.meta_env, **(env or {})},
        )
        process.probe_token = self.tokens["admin"]
        process.ca_pem = self.ca.cert_pem
        process.server_name = META_NAME
        self.metas.append(process)
        return process

    def start_balancer(self) -> Balancer:
        self.balancer = Balancer([m.addr for m in self.metas]).start()
        return self.balancer

    def start_query(self) -> LakeProcess:
        return self.start_queries(1)[0]

    def start_queries(self, count: int) -> list[LakeProcess]:
        """``count`` Query replicas behind the balancer, started together."""
        replicas = [self._query_process() for _ in range(count)]
        start_together(*replicas)
        return replicas

    def start_meta_and_query(self) -> tuple[LakeProcess, LakeProcess]:
        """One Metasrv (the leader once it serves), the balancer to it, one Query replica.

        Started together: the replica binds and reports NOT_SERVING until its
        first catalog snapshot arrives through the balancer, so it serves once
        the Metasrv leads.
        """
        meta = self._meta_process()
        self.start_balancer()
        query = self._query_process()
        start_together(meta, query)
        self.wait_for_leader()
        return meta, query

    def _query_process(self) -> LakeProcess:
        assert self.balancer is not None, "start the balancer first"
        addr = f"127.0.0.1:{free_port()}"
        name = f"query-{addr.rsplit(':', 1)[1]}"
        process = LakeProcess(
            name,
            [
                "-m",
                "lake_query",
                "--addr",
                addr,
                "--metadata-addr",
                f"https://{self.balancer.addr}",
            ],
            addr,
            self.root / f"{name}.log",
            dict(self.query_env),
        )
        process.probe_token = self.tokens["fleet"]
        self.queries.append(process)
        return process

    def stop(self) -> None:
        for process in [*self.queries, *self.metas]:
            process.stop()
        if self.balancer is not None:
            self.balancer.stop()

    def logs(self) -> str:
        return "".join(p.log()[-6000:] for p in [*self.metas, *self.queries])

    # -- clients -----------------------------------------------------------------

    def meta_client(
        self, target: LakeProcess | str | None = None, token: str = "admin"
    ) -> MetaClient:
        """An admin client of one Metasrv node (default: the balancer)."""
        if isinstance(target, LakeProcess):
            addr = target.addr
        else:
            assert self.balancer is not None
            addr = target or self.balancer.addr
        return MetaClient(
            f"https://{addr}",
            token=self.tokens[token],
            ca_pem=self.ca.cert_pem,
            server_name=META_NAME,
            timeout_s=60,
        )

    def admin(self, work: Callable[[MetaClient], Any], target: LakeProcess | None = None) -> Any:
        async def go() -> Any:
            async with self.meta_client(target) as client:
                return await work(client)

        return asyncio.run(go())

    def sdk(self, query: LakeProcess, *, timeout_s: float = 60) -> lake_sdk.Client:
        return (
            lake_sdk.Client.builder(f"http://{query.addr}")
            .with_bearer_token(self.tokens["fleet"])
            .with_append_attempts(1)
            .with_timeout(timeout_s)
            .connect()
        )

    def dynamodb(self) -> Any:
        return boto3.client(
            "dynamodb",
            endpoint_url=self.dynamo.endpoint,
            region_name="us-east-1",
            aws_access_key_id="dynalite",
            aws_secret_access_key="dynalite",
        )

    # -- the lease -----------------------------------------------------------------

    def lease(self) -> dict[str, Any]:
        item = (
            self.dynamodb()
            .get_item(
                TableName=REGISTRY_TABLE,
                Key={"pk": {"S": "lease#0"}, "sk": {"S": "metasrv"}},
                ConsistentRead=True,
            )
            .get("Item", {})
        )
        return {k: next(iter(v.values())) for k, v in item.items()}

    def leader(self) -> LakeProcess | None:
        lease = self.lease()
        if not lease or lease.get("released"):
            return None
        port = str(lease["url"]).rsplit(":", 1)[1]
        return next((m for m in self.metas if m.addr.endswith(f":{port}")), None)

    def wait_for_leader(
        self, *, other_than: LakeProcess | None = None, timeout_s: float = 30
    ) -> tuple[LakeProcess, float]:
        """The leader (a different node than ``other_than``) and when it was seen."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader is not other_than:
                return leader, time.monotonic()
            time.sleep(0.05)
        raise AssertionError(f"no new leader within {timeout_s}s:\n{self.logs()}")


@pytest.fixture
def make_cloud_lake(
    tmp_path: Path, s3_server: SeaweedS3, s3_bucket: str, dynamodb_server: Dynalite
) -> Iterator[Callable[..., CloudLake]]:
    """``make_cloud_lake(s3=..., meta_env=..., query_env=...)``: the environment, no processes."""
    made: list[CloudLake] = []

    def make(
        *,
        s3: SeaweedS3 | None = None,
        bucket: str | None = None,
        meta_env: dict[str, str] | None = None,
        query_env: dict[str, str] | None = None,
    ) -> CloudLake:
        server = s3 or s3_server
        if s3 is not None and bucket is None:
            bucket = "cloud-" + os.urandom(4).hex()
            server.create_bucket(bucket)
        bucket = bucket or s3_bucket
        ca = TestCA(tmp_path / "pki")
        cert = ca.issue(META_NAME, ip_addresses=())
        tokens = {n: "lk_" + secrets.token_urlsafe(24) for n in ("admin", "query", "peer", "fleet")}
        meta_map = _principals(
            tmp_path / "meta-principals.json",
            [
                {
                    "token": tokens["admin"],
                    "principal_id": "ops",
                    "tenant_id": "lake",
                    "role": "admin",
                },
                {
                    "token": tokens["query"],
                    "principal_id": "query-fleet",
                    "tenant_id": "lake",
                    "role": "query_service",
                    "namespaces": "*",
                },
                {
                    "token": tokens["peer"],
                    "principal_id": "metasrv-peer",
                    "tenant_id": "lake",
                    "role": "metadata_peer",
                    "namespaces": "*",
                },
            ],
        )
        query_map = _principals(
            tmp_path / "query-principals.json",
            [
                {
                    "token": tokens["fleet"],
                    "principal_id": "fleet-ingest",
                    "tenant_id": "acme",
                    "role": "user",
                    "namespaces": USER_NAMESPACES,
                }
            ],
        )
        aws = {
            **server.env(),
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_server.endpoint,
            "AWS_REGION": "us-east-1",
        }
        storage = {
            **aws,
            "LAKE_S3_BUCKET": bucket,
            "LAKE_MANAGED_OBJECT_PREFIX": "warehouse/managed",
            "LAKE_MANIFEST_DYNAMODB_TABLE": MANIFEST_TABLE,
            "LAKE_STORAGE_TIMEOUT_MS": "3000",
            "LAKE_SHUTDOWN_GRACE_MS": "8000",
        }
        lake = CloudLake(
            root=tmp_path,
            s3=server,
            bucket=bucket,
            dynamo=dynamodb_server,
            ca=ca,
            tokens=tokens,
            meta_env={
                **storage,
                "LAKE_CLOUD_MODE": "true",
                "LAKE_TABLE_PREFIX": TABLE_PREFIX,
                "LAKE_DYNAMODB_TABLE": REGISTRY_TABLE,
                "LAKE_AUTH_PRINCIPALS_FILE": str(meta_map),
                **cert.env(),
                "LAKE_PEER_AUTH_TOKEN_FILE": str(_private(tmp_path / "peer-token", tokens["peer"])),
                "LAKE_PEER_CA_FILE": str(ca.cert_file),
                "LAKE_PEER_SERVER_NAME": META_NAME,
                **(meta_env or {}),
            },
            query_env={
                **storage,
                "LAKE_AUTH_PRINCIPALS_FILE": str(query_map),
                "LAKE_METADATA_AUTH_TOKEN_FILE": str(
                    _private(tmp_path / "query-token", tokens["query"])
                ),
                "LAKE_METADATA_CA_FILE": str(ca.cert_file),
                "LAKE_METADATA_SERVER_NAME": META_NAME,
                "LAKE_QUERY_TICKET_KEYS_FILE": str(
                    write_ticket_keys(tmp_path / "ticket-keys.json")
                ),
                "LAKE_QUERY_CATALOG_REFRESH_MS": "200",
                **(query_env or {}),
            },
        )
        made.append(lake)
        return lake

    try:
        yield make
    finally:
        for lake in made:
            lake.stop()
