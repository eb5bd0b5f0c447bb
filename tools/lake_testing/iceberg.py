"""SeaweedFS as an Iceberg REST catalog for tests: S3 plus an S3 Tables warehouse.

``weed mini`` serves S3 and SeaweedFS's Iceberg REST catalog. Its catalog needs
an S3 Tables bucket as warehouse (created at startup with ``-tableBucket``) and
authenticates clients by OAuth2 client credentials ``ACCESS_KEY:SECRET_KEY``
against its own ``/v1/oauth/tokens`` (see FINDINGS, "pyiceberg and the REST
catalog"). Every gRPC port is set explicitly: otherwise ``weed mini`` dials
admin-port + 10000 for its worker, which another process may own.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tools.lake_testing.s3proxy import S3Proxy
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

__all__ = ["EPISODE_ROWS", "SeaweedIceberg", "federation_env", "write_episodes"]


@dataclass(repr=False)
class SeaweedIceberg(SeaweedS3):
    """One ``weed mini`` with S3, the Iceberg REST catalog and a warehouse bucket."""

    warehouse_bucket: str = "lakewh"

    def __repr__(self) -> str:
        return f"SeaweedIceberg(s3={self.endpoint!r}, catalog={self.iceberg_endpoint!r})"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.warehouse_bucket}/"

    @property
    def credential(self) -> str:
        """The OAuth2 client credential the catalog accepts (``id:secret``)."""
        return f"{self.access_key}:{self.secret_key}"

    #: Every gRPC port too: otherwise ``weed mini`` dials admin-port + 10000.
    _PORTS: ClassVar[tuple[str, ...]] = (
        *SeaweedS3._PORTS,
        "master.port.grpc",
        "volume.port.grpc",
        "filer.port.grpc",
        "admin.port.grpc",
        "s3.port.grpc",
    )

    def start(self, timeout_s: float = 90.0) -> SeaweedIceberg:
        self._launch(f"-tableBucket={self.warehouse_bucket}")
        self._wait_ready(timeout_s)
        self._wait_catalog(timeout_s)
        return self

    def _wait_catalog(self, timeout_s: float) -> None:
        """Wait until the catalog answers and lists the warehouse's namespaces."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                self.catalog().list_namespaces()
                return
            except (OSError, urllib.error.URLError) as exc:
                last = exc
            except Exception as exc:  # the catalog is up but the warehouse not yet
                last = exc
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"Iceberg catalog not ready after {timeout_s}s ({last!r})")

    def s3_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties for this S3 server."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
            "s3.path-style-access": "true",
        }

    def catalog(self, name: str = "seaweed", **extra: str) -> Any:
        """A pyiceberg RestCatalog on this server (for set-up and assertions)."""
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog(
            name,
            uri=self.iceberg_endpoint,
            warehouse=self.warehouse,
            credential=self.credential,
            **{"oauth2-server-uri": f"{self.iceberg_endpoint}/v1/oauth/tokens"},
            **{**self.s3_properties(), **extra},
        )

    def token(self) -> str:
        """A bearer token from the catalog's own OAuth2 endpoint."""
        body = (
            f"grant_type=client_credentials&client_id={self.access_key}"
            f"&client_secret={self.secret_key}&scope=catalog"
        ).encode()
        request = urllib.request.Request(
            f"{self.iceberg_endpoint}/v1/oauth/tokens",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["access_token"])

    def federation_env(self, namespaces: str, *, endpoint: str | None = None) -> dict[str, str]:
        """A Query replica's environment federating this catalog (``endpoint``: a proxy)."""
        return federation_env(self, namespaces, endpoint=endpoint)


def federation_env(
    server: SeaweedIceberg, namespaces: str, *, endpoint: str | None = None
) -> dict[str, str]:
    """``LAKE_ICEBERG_*`` plus the workload identity (AWS variables) for ``server``."""
    return {
        "LAKE_ICEBERG_REST_ENDPOINT": endpoint or server.iceberg_endpoint,
        "LAKE_ICEBERG_WAREHOUSE": server.warehouse,
        "LAKE_ICEBERG_NAMESPACES": namespaces,
        "LAKE_ICEBERG_REST_CREDENTIAL": server.credential,
        "LAKE_ICEBERG_S3_ENDPOINT": server.endpoint,
        "LAKE_ICEBERG_S3_REGION": server.region,
        "LAKE_ICEBERG_S3_PATH_STYLE": "true",
        # Query reads Iceberg files with its own (workload) identity: the AWS chain.
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": server.region,
    }


@contextmanager
def in_process_federation(
    server: SeaweedIceberg, namespaces: str, env: Mapping[str, str] | None = None
) -> Iterator[Any]:
    """A started ``IcebergFederation`` over ``server`` in this process, closed on exit.

    ``env``: variables over :func:`federation_env`'s (an S3 proxy, a timeout).
    """
    from lake_iceberg.federation import FederationConfig, IcebergFederation

    env = {**federation_env(server, namespaces), **(env or {})}
    file_io = {
        "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
    }
    config = FederationConfig.from_env(env)
    assert config is not None
    federation = IcebergFederation(config, file_io=file_io)
    federation.start()
    try:
        yield federation
    finally:
        federation.close()


@contextmanager
def proxied_query(
    server: SeaweedIceberg, namespace: str, root: Path, env: Mapping[str, str] | None = None
) -> Iterator[tuple[S3Proxy, LakeProcess]]:
    """(S3Proxy, Query replica) federating ``server`` with its object reads through the proxy.

    ``env``: variables over :func:`federation_env`'s. Metasrv, Query and the
    proxy are stopped on exit.
    """
    proxy = S3Proxy(server.endpoint).start()
    try:
        query_env = {
            **federation_env(server, namespace),
            "LAKE_ICEBERG_S3_ENDPOINT": proxy.endpoint,  # Query's reads pass the proxy
            **(env or {}),
        }
        meta = start_meta(root / "data", root)
        try:
            query = start_query(meta.addr, root, env=query_env)
            try:
                yield proxy, query
            finally:
                query.stop()
        finally:
            meta.stop()
    finally:
        proxy.stop()


def direct_and_iceberg_rust(federation: Any, namespace: str, table: str, columns: str) -> Any:
    """``SELECT columns`` of an Iceberg table two ways: (Lake's direct read, iceberg-rust's).

    The first goes through a :class:`~lake_query.planning.Planner` and must be read
    by the plug-in itself (no DataFusion session runs it); the second scans
    iceberg-rust's provider of the same table in DataFusion.
    """
    import pyarrow as pa
    from datafusion import SessionContext
    from datafusion.catalog import Table

    from lake_core.principal import DEV_PRINCIPAL
    from lake_query.planning import Planner

    reference = SessionContext()
    reference.register_table("t", Table(federation.plan(namespace, table).provider()))
    expected = reference.sql(f"SELECT {columns} FROM t").to_arrow_table()
    planner = Planner(lambda ref: None, external=[federation])
    sql = f"SELECT {columns} FROM iceberg.{namespace}.{table}"
    stream = planner.execute(planner.plan(sql, DEV_PRINCIPAL).spec, DEV_PRINCIPAL)
    assert stream._session is None  # read by the plug-in: no DataFusion session runs it
    return pa.Table.from_batches(list(stream), expected.schema), expected


#: The rows :func:`write_episodes` appends, one append per robot.
EPISODE_ROWS: list[dict[str, Any]] = [
    {"episode_id": robot * 100 + i, "robot_id": name, "reward": float(i) / 2}
    for robot, name in enumerate(["alpha", "beta", "gamma"])
    for i in range(20)
]


def write_episodes(catalog: Any, namespace: str, table: str = "episodes") -> Any:
    """An Iceberg table written by pyiceberg: three appends, one data file per robot."""
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    schema = Schema(
        NestedField(1, "episode_id", LongType(), required=False),
        NestedField(2, "robot_id", StringType(), required=False),
        NestedField(3, "reward", DoubleType(), required=False),
    )
    if namespace not in {ns[0] for ns in catalog.list_namespaces()}:
        catalog.create_namespace(namespace)
    created = catalog.create_table((namespace, table), schema=schema)
    arrow = schema.as_arrow()
    for name in ("alpha", "beta", "gamma"):
        rows = [r for r in EPISODE_ROWS if r["robot_id"] == name]
        created.append(pa.Table.from_pylist(rows, schema=arrow))
    return catalog.load_table((namespace, table))
