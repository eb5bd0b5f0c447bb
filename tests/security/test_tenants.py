"""Tenant isolation: another tenant's namespaces are invisible, hidden equals absent.

Alice (tenant acme, namespace acme_ops) against Bob's globex_ops, where
``globex_ops.plans`` exists and ``globex_ops.nothing`` does not: listing,
describing, querying and appending must fail identically for both.
"""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from lake_core import protocol
from lake_core.errors import LakeError, PermissionDenied
from lake_core.metaclient import MetaClient
from lake_core.principal import Principal
from lake_core.proto import flight_sql_pb2 as sql_pb
from tests.security.cluster import (
    META_NAME,
    RUNS,
    RUNS_SCHEMA,
    SECRETS,
    SECRETS_SCHEMA,
    SecureCluster,
    bearer,
    command,
    plans,
    runs,
    statement,
)
from tests.security.conftest import sdk

EXISTING, ABSENT = "plans", "nothing"


def same_error(existing: str, absent: str) -> None:
    """The two errors differ only by the table name the caller typed."""
    assert existing.replace(EXISTING, "<t>") == absent.replace(ABSENT, "<t>")


def _listing(secure: SecureCluster, user: str, message: object) -> pa.Table:
    options = bearer(secure.tokens[user])
    with secure.flight() as client:
        info = client.get_flight_info(command(message), options)
        return client.do_get(info.endpoints[0].ticket, options).read_all()


def test_listings_show_only_granted_namespaces(secure: SecureCluster) -> None:
    for user, namespace, table in (
        ("alice", "acme_ops", "runs"),
        ("bob", "globex_ops", "plans"),
    ):
        tables = _listing(secure, user, sql_pb.CommandGetTables(include_schema=True))
        # Other tests may add tables; only the caller's namespace is ever listed.
        assert set(tables.column("db_schema_name").to_pylist()) == {namespace}
        assert table in tables.column("table_name").to_pylist()
        schemas = _listing(secure, user, sql_pb.CommandGetDbSchemas())
        assert schemas.column("db_schema_name").to_pylist() == [namespace]
        # Asking for the other tenant's namespace by name finds nothing.
        other = "globex_ops" if user == "alice" else "acme_ops"
        probe = sql_pb.CommandGetTables(db_schema_filter_pattern=other)
        assert _listing(secure, user, probe).num_rows == 0
    # Eve is in tenant acme but not granted acme_ops: grants are per namespace.
    assert _listing(secure, "eve", sql_pb.CommandGetTables()).num_rows == 0


def test_information_schema_schemata_lists_granted_namespaces_without_internals(
    secure: SecureCluster,
) -> None:
    """schemata lists the caller's namespaces, owner NULL (it showed a Python method's repr)."""
    with sdk(secure, "alice") as client:
        rows = client.query_table(
            "SELECT catalog_name, schema_name, schema_owner FROM information_schema.schemata"
        )
    assert rows.to_pylist() == [
        {"catalog_name": "lake", "schema_name": "acme_ops", "schema_owner": None}
    ]


def test_describe_is_denied_alike_for_existing_and_absent_tables(secure: SecureCluster) -> None:
    with sdk(secure, "alice") as alice:
        assert alice.table_schema(RUNS).names == RUNS_SCHEMA.names
        errors = []
        for name in (EXISTING, ABSENT):
            with pytest.raises(PermissionDenied) as caught:
                alice.table_schema(f"globex_ops.{name}")
            errors.append(str(caught.value))
    same_error(*errors)


@pytest.mark.parametrize(
    "template",
    [
        "SELECT * FROM globex_ops.{t}",
        "SELECT * FROM lake.globex_ops.{t}",
        "SELECT r.run_id FROM acme_ops.runs r JOIN globex_ops.{t} p ON true",
        "SELECT * FROM acme_ops.runs WHERE run_id IN (SELECT budget FROM globex_ops.{t})",
        "WITH x AS (SELECT * FROM globex_ops.{t}) SELECT count(*) FROM x",
    ],
)
def test_queries_are_denied_alike_for_existing_and_absent_tables(
    secure: SecureCluster, template: str
) -> None:
    options = bearer(secure.tokens["alice"])
    errors = []
    with secure.flight() as client:
        for name in (EXISTING, ABSENT):
            with pytest.raises(flight.FlightUnauthorizedError) as caught:
                client.get_flight_info(statement(template.format(t=name)), options)
            errors.append(str(caught.value))
    same_error(*errors)


def _raw_append(secure: SecureCluster, user: str, table: str) -> str:
    namespace, name = table.split(".")
    cmd = protocol.AppendCommand(
        table={"namespace": namespace, "name": name},
        operation_id="0190f1e2-0000-7000-8000-0000000000dd",
    )
    descriptor = flight.FlightDescriptor.for_command(protocol.encode(cmd))
    with secure.flight() as client:
        writer, reader = client.do_put(descriptor, SECRETS_SCHEMA, bearer(secure.tokens[user]))
        try:
            writer.write_batch(plans())
            writer.done_writing()
            reader.read()
            writer.close()  # pyarrow reports the server's status here
        except flight.FlightUnauthorizedError as exc:
            return str(exc)
    raise AssertionError(f"{user} appended to {table}")


def test_appends_are_denied_alike_for_existing_and_absent_tables(secure: SecureCluster) -> None:
    same_error(
        _raw_append(secure, "alice", f"globex_ops.{EXISTING}"),
        _raw_append(secure, "alice", f"globex_ops.{ABSENT}"),
    )
    with sdk(secure, "alice") as alice, pytest.raises(PermissionDenied):
        alice.append_batches(SECRETS, [plans()])
    with sdk(secure, "bob") as bob:
        # Bob's table is untouched, and Bob cannot write into acme either.
        table = bob.query_table("SELECT * FROM globex_ops.plans ORDER BY plan")
        assert table.num_rows == 2
        with pytest.raises(PermissionDenied):
            bob.append_batches(RUNS, [runs(0, 1)])


def test_tenants_sharing_grants_see_the_same_tables(secure: SecureCluster) -> None:
    with sdk(secure, "amy") as amy:
        count = amy.query_table("SELECT count(*) AS n FROM acme_ops.runs")
    assert count.column("n")[0].as_py() > 0


def test_a_refused_large_append_keeps_its_status(secure: SecureCluster) -> None:
    """The refusal reaches the client intact even while it is still streaming data."""
    big = pa.RecordBatch.from_pydict(
        {"plan": ["x" * 4_000] * 2_000, "budget": list(range(2_000))}, schema=SECRETS_SCHEMA
    )  # ~8 MB, refused on its first message
    alice = Principal(
        principal_id="alice", tenant_id="acme", role="user", namespaces=frozenset({"acme_ops"})
    )

    async def through_metasrv() -> list[str]:
        seen = []
        async with _service(secure) as service:
            for i in range(10):
                cmd = protocol.AppendCommand(
                    table=SECRETS, operation_id=f"0190f1e2-0000-7000-8000-{i:012d}"
                )
                try:
                    await service.append(cmd, SECRETS_SCHEMA, [big], on_behalf_of=alice)
                except LakeError as exc:
                    seen.append(type(exc).__name__)
        return seen

    assert asyncio.run(through_metasrv()) == ["PermissionDenied"] * 10
    descriptor = flight.FlightDescriptor.for_command(
        protocol.encode(
            protocol.AppendCommand(
                table=SECRETS, operation_id="0190f1e2-0000-7000-8000-0000000000ee"
            )
        )
    )
    with secure.flight() as client:
        outcomes = [_put_twice(client, descriptor, big, secure.tokens["alice"]) for _ in range(5)]
    assert outcomes == ["unauthorized"] * 5


def _put_twice(
    client: flight.FlightClient,
    descriptor: flight.FlightDescriptor,
    batch: pa.RecordBatch,
    token: str,
) -> str:
    writer, reader = client.do_put(descriptor, batch.schema, bearer(token))
    try:
        writer.write_batch(batch)
        writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()
    except flight.FlightUnauthorizedError:
        return "unauthorized"
    except (flight.FlightError, pa.ArrowException) as exc:
        return str(exc)
    return "accepted"


def _service(secure: SecureCluster) -> MetaClient:
    return MetaClient(
        secure.meta.http_url,
        token=secure.tokens["query_service"],
        ca_pem=secure.ca.cert_pem,
        server_name=META_NAME,
    )
