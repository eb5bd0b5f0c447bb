"""A secured Lake for tests: TLS everywhere, principal maps, two tenants.

Metasrv serves TLS with a certificate naming only ``lake-meta.test`` (so
Query must use ``LAKE_METADATA_SERVER_NAME``) and holds the Query→Metasrv
``query_service`` credential and an admin. Query serves TLS for
``lake-query.test`` and 127.0.0.1 and maps four user tokens:

- ``alice`` and ``amy``: tenant ``acme``, namespace ``acme_ops``;
- ``bob``: tenant ``globex``, namespace ``globex_ops``;
- ``eve``: tenant ``acme`` too, but a different principal with no grants
  that matter here (``acme_lab``).

Everything real traffic touches listens on 127.0.0.1; configured
credentials apply on loopback exactly as anywhere else.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

from lake_core.config import QUERY_DATA_ADDR
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tools.lake_testing.dataplane import GrpcOptions
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query
from tools.lake_testing.tls import TestCA

META_NAME = "lake-meta.test"
QUERY_NAME = "lake-query.test"


RUNS = TableRef("acme_ops", "runs")
RUNS_SCHEMA = pa.schema([("run_id", pa.int64()), ("robot", pa.utf8()), ("score", pa.float64())])
SECRETS = TableRef("globex_ops", "plans")
SECRETS_SCHEMA = pa.schema([("plan", pa.utf8()), ("budget", pa.int64())])
ROWS = 5_000


def runs(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.RecordBatch.from_pydict(
        {
            "run_id": ids,
            "robot": [f"robot-{i % 7}" for i in ids],
            "score": [(i % 100) / 10 for i in ids],
        },
        schema=RUNS_SCHEMA,
    )


def plans() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"plan": ["takeover", "merger"], "budget": [10**9, 5 * 10**8]}, schema=SECRETS_SCHEMA
    )


def token() -> str:
    return "lk_" + secrets.token_urlsafe(32)


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def principals_file(path: Path, bindings: list[dict[str, Any]], mode: int = 0o600) -> Path:
    return private_file(path, json.dumps({"bindings": bindings}), mode)


def key_ring_file(path: Path, active: str, keys: dict[str, bytes]) -> Path:
    doc = {
        "active": active,
        "keys": [{"id": k, "key": base64.b64encode(v).decode()} for k, v in keys.items()],
    }
    return private_file(path, json.dumps(doc))


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def command(message: Any) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def bearer(value: str | None) -> flight.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {value}".encode())] if value else []
    return flight.FlightCallOptions(headers=headers, timeout=60)


@dataclass
class SecureCluster:
    root: Path
    ca: TestCA
    tokens: dict[str, str]
    meta: LakeProcess
    query: LakeProcess
    query_env: dict[str, str]
    extra: list[LakeProcess] = field(default_factory=list)

    def flight(
        self,
        process: LakeProcess | None = None,
        *,
        ca: bool = True,
        options: GrpcOptions | None = None,
    ) -> flight.FlightClient:
        target = process or self.query
        if ca:
            return flight.FlightClient(
                f"grpc+tls://{target.addr}",
                tls_root_certs=self.ca.cert_pem,
                generic_options=options,
            )
        return flight.FlightClient(f"grpc+tls://{target.addr}", generic_options=options)

    def doget(
        self, process: LakeProcess | None = None, *, options: GrpcOptions | None = None
    ) -> flight.FlightClient:
        """Where ``process`` redeems tickets: its native data plane when on, else its listener.

        ``options``: gRPC channel arguments for the client (``generic_options``).
        """
        target = process or self.query
        data = target.env.get(QUERY_DATA_ADDR)
        if data is None:
            return self.flight(target, options=options)
        return flight.FlightClient(
            f"grpc+tls://{data}", tls_root_certs=self.ca.cert_pem, generic_options=options
        )

    def add_data_plane(self, name: str, env: dict[str, str] | None = None) -> LakeProcess:
        """A replica serving DoGet on a native data plane too (``LAKE_QUERY_DATA_ADDR``)."""
        return self.add_query(name, {**(env or {}), **data_plane_env()})

    def add_serving(self, path: str, name: str, env: dict[str, str]) -> LakeProcess:
        """A replica with ``env`` whose DoGet is served by ``path`` (one of ``DOGET_PATHS``)."""
        if path == "grpcio":
            return self.add_query(name, env)
        return self.add_data_plane(f"{name}-dataplane", env)

    def admin(self) -> MetaClient:
        return MetaClient(
            self.meta.http_url,
            token=self.tokens["meta_admin"],
            ca_pem=self.ca.cert_pem,
            server_name=META_NAME,
        )

    def admin_call(self, work: Any) -> Any:
        async def go() -> Any:
            async with self.admin() as client:
                return await work(client)

        return asyncio.run(go())

    def add_query(self, name: str, env: dict[str, str]) -> LakeProcess:
        """Another Query replica behind the same Metasrv, with ``env`` overrides."""
        replica = start_query(
            self.meta.addr,
            self.root,
            env={**self.query_env, **env},
            metadata_url=self.meta.http_url,
            probe_token=self.tokens["alice"],
            ca_pem=self.ca.cert_pem,
        )
        self.extra.append(replica)
        return replica

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.root.glob("*.log"))

    def stop(self) -> None:
        for process in [*self.extra, self.query, self.meta]:
            process.stop()


def on_data_plane(process: LakeProcess) -> bool:
    """Whether ``process`` serves DoGet on a native data plane."""
    return QUERY_DATA_ADDR in process.env


def data_plane_env() -> dict[str, str]:
    """The setting that turns a replica's native data plane on, on a free loopback port."""
    return {QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}"}


def start_secure_cluster(root: Path) -> SecureCluster:
    root.mkdir(parents=True, exist_ok=True)
    ca = TestCA(root / "pki")
    meta_cert = ca.issue(META_NAME, ip_addresses=())
    query_cert = ca.issue(QUERY_NAME)
    tokens = {
        name: token() for name in ("meta_admin", "query_service", "alice", "amy", "bob", "eve")
    }
    meta_map = principals_file(
        root / "meta-principals.json",
        [
            {
                "token": tokens["query_service"],
                "principal_id": "query-fleet",
                "tenant_id": "lake",
                "role": "query_service",
                "namespaces": "*",
            },
            {
                "token": tokens["meta_admin"],
                "principal_id": "ops-admin",
                "tenant_id": "lake",
                "role": "admin",
            },
        ],
    )
    users = [
        ("alice", "acme", ["acme_ops"]),
        ("amy", "acme", ["acme_ops"]),
        ("bob", "globex", ["globex_ops"]),
        ("eve", "acme", ["acme_lab"]),
    ]
    query_map = principals_file(
        root / "query-principals.json",
        [
            {
                "token": tokens[name],
                "principal_id": name,
                "tenant_id": tenant,
                "role": "user",
                "namespaces": namespaces,
            }
            for name, tenant, namespaces in users
        ],
    )
    meta_env = {"LAKE_AUTH_PRINCIPALS_FILE": str(meta_map), **meta_cert.env()}
    meta = start_meta(
        root / "data",
        root,
        env=meta_env,
        probe_token=tokens["meta_admin"],
        ca_pem=ca.cert_pem,
        server_name=META_NAME,
    )
    query_env = {
        "LAKE_AUTH_PRINCIPALS_FILE": str(query_map),
        **query_cert.env(),
        "LAKE_METADATA_AUTH_TOKEN_FILE": str(
            private_file(root / "meta-token", tokens["query_service"] + "\n")
        ),
        "LAKE_METADATA_CA_FILE": str(ca.cert_file),
        "LAKE_METADATA_SERVER_NAME": META_NAME,
        "LAKE_QUERY_TICKET_KEYS_FILE": str(
            key_ring_file(root / "ticket-keys.json", "k1", {"k1": os.urandom(32)})
        ),
    }
    try:
        query = start_query(
            meta.addr,
            root,
            env=query_env,
            metadata_url=meta.http_url,
            probe_token=tokens["alice"],
            ca_pem=ca.cert_pem,
            extra_args=("--log-level", "debug"),
        )
    except BaseException:
        meta.stop()
        raise
    return SecureCluster(root, ca, tokens, meta, query, query_env)
