"""TLS and bearer authentication on every RPC, with independent clients."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import lake_sdk
from lake_core import protocol
from lake_core.errors import PermissionDenied, Unauthenticated, Unavailable
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_sql_pb2 as sql_pb
from tests.security.cluster import (
    META_NAME,
    ROWS,
    RUNS,
    RUNS_SCHEMA,
    SECRETS,
    SecureCluster,
    bearer,
    command,
    private_file,
    runs,
    statement,
)
from tools.lake_testing.dataplane import data_plane_streams
from tools.lake_testing.servers import LakeProcess, free_port

SQL = "SELECT run_id, robot, score FROM acme_ops.runs ORDER BY run_id"


def expected_runs() -> pa.Table:
    return pa.Table.from_batches([runs(0, ROWS)])


# ``serving`` runs a test once per DoGet path: grpcio, and the native data plane,
# whose location the FlightInfo names; data_plane_streams proves where rows came from.


def test_pyarrow_flight_over_tls_with_a_token_reads_rows(
    secure: SecureCluster, serving: LakeProcess
) -> None:
    options = bearer(secure.tokens["alice"])
    before = data_plane_streams(serving)
    with secure.flight(serving) as client:
        info = client.get_flight_info(statement(SQL), options)
        locations = info.endpoints[0].locations
        if not locations:
            table = client.do_get(info.endpoints[0].ticket, options).read_all()
        else:
            # pyarrow's client does not follow locations itself: the caller dials the
            # location with the same CA bundle and sends the same token.
            with flight.FlightClient(locations[0], tls_root_certs=secure.ca.cert_pem) as data:
                table = data.do_get(info.endpoints[0].ticket, options).read_all()
    assert table.equals(expected_runs())
    assert data_plane_streams(serving) - before == len(locations)


def _adbc(
    secure: SecureCluster,
    token: str | None,
    *,
    ca: bool = True,
    process: LakeProcess | None = None,
) -> flightsql.Connection:
    kwargs: dict[str, str] = {}
    if token is not None:
        kwargs["adbc.flight.sql.authorization_header"] = f"Bearer {token}"
    if ca:
        kwargs["adbc.flight.sql.client_option.tls_root_certs"] = secure.ca.cert_pem.decode()
    return flightsql.connect((process or secure.query).url, db_kwargs=kwargs)


def test_adbc_over_tls_with_a_token_reads_rows_and_lists_only_its_tables(
    secure: SecureCluster, serving: LakeProcess
) -> None:
    before = data_plane_streams(serving)
    with _adbc(secure, secure.tokens["alice"], process=serving) as conn, conn.cursor() as cur:
        cur.execute(SQL)
        table = cur.fetch_arrow_table()
        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
    assert table.select(RUNS_SCHEMA.names).cast(RUNS_SCHEMA).equals(expected_runs())
    # ADBC followed the data plane's location with its token and CA (metadata too).
    if serving is not secure.query:
        assert data_plane_streams(serving) - before >= 2
    listed = {
        (schema["db_schema_name"], t["table_name"])
        for catalog in objects
        for schema in catalog["catalog_db_schemas"] or []
        for t in schema["db_schema_tables"] or []
    }
    # Other tests may add acme tables; nothing outside acme_ops is ever listed.
    assert ("acme_ops", "runs") in listed
    assert {namespace for namespace, _ in listed} == {"acme_ops"}


@pytest.mark.parametrize("token", [None, "lk_wrong-token-that-is-long-enough"])
def test_adbc_without_a_valid_token_is_unauthenticated(
    secure: SecureCluster, token: str | None
) -> None:
    assert _adbc_error(secure, token) == grpc.StatusCode.UNAUTHENTICATED.value[0]


def _adbc_error(secure: SecureCluster, token: str | None, *, ca: bool = True) -> int | None:
    try:
        with _adbc(secure, token, ca=ca) as conn, conn.cursor() as cur:
            cur.execute(SQL)
            rows = cur.fetch_arrow_table()
    except adbc_driver_manager.Error as exc:
        return exc.vendor_code
    raise AssertionError(f"ADBC read {rows.num_rows} rows without valid credentials")


def test_adbc_without_the_ca_cannot_connect(secure: SecureCluster) -> None:
    code = _adbc_error(secure, secure.tokens["alice"], ca=False)
    assert code == grpc.StatusCode.UNAVAILABLE.value[0]


def test_pyarrow_without_the_ca_fails_the_handshake(secure: SecureCluster) -> None:
    with (
        secure.flight(ca=False) as client,
        pytest.raises(flight.FlightUnavailableError),
    ):
        client.get_flight_info(statement(SQL), bearer(secure.tokens["alice"]))


def _every_rpc(
    client: flight.FlightClient, options: flight.FlightCallOptions, ticket: bytes
) -> None:
    """One call of each Flight / Flight SQL kind Lake serves; each must be refused."""
    calls = {
        "GetFlightInfo(statement)": lambda: client.get_flight_info(statement(SQL), options),
        "GetFlightInfo(GetTables)": lambda: client.get_flight_info(
            command(sql_pb.CommandGetTables(include_schema=True)), options
        ),
        "GetFlightInfo(GetDbSchemas)": lambda: client.get_flight_info(
            command(sql_pb.CommandGetDbSchemas()), options
        ),
        "GetFlightInfo(GetSqlInfo)": lambda: client.get_flight_info(
            command(sql_pb.CommandGetSqlInfo()), options
        ),
        "GetSchema": lambda: client.get_schema(statement(SQL), options),
        "DoGet": lambda: client.do_get(flight.Ticket(ticket), options).read_all(),
        "DoAction(table_schema)": lambda: list(
            client.do_action(
                flight.Action(
                    protocol.TABLE_SCHEMA, protocol.encode(protocol.TableRequest(table=RUNS))
                ),
                options,
            )
        ),
        "DoAction(CreatePreparedStatement)": lambda: list(
            client.do_action(
                flight.Action(
                    "CreatePreparedStatement",
                    _packed(sql_pb.ActionCreatePreparedStatementRequest(query=SQL)),
                ),
                options,
            )
        ),
        "ListActions": lambda: client.list_actions(options),
        "DoPut(append)": lambda: _append(client, options, RUNS),
    }
    outcomes = {name: _status_of(call) for name, call in calls.items()}
    assert outcomes == dict.fromkeys(calls, "unauthenticated")


def _status_of(call: Callable[[], object]) -> str:
    try:
        call()
    except (flight.FlightError, OSError) as exc:
        # pyarrow raises FlightUnauthenticatedError, or a plain OSError for GetSchema.
        text = str(exc)
        return "unauthenticated" if "unauthenticated error" in text else text
    return "succeeded"


def _packed(message: object) -> bytes:
    from google.protobuf import any_pb2

    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return wrapper.SerializeToString()


def _append(
    client: flight.FlightClient, options: flight.FlightCallOptions, table: TableRef
) -> None:
    cmd = protocol.AppendCommand(table=table, operation_id="0190f1e2-0000-7000-8000-0000000000aa")
    descriptor = flight.FlightDescriptor.for_command(protocol.encode(cmd))
    writer, reader = client.do_put(descriptor, RUNS_SCHEMA, options)
    try:
        writer.write_batch(runs(0, 3))
        writer.done_writing()
        reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize("token", [None, "lk_not-a-bound-token-0000000000"])
def test_every_query_rpc_needs_a_valid_token(secure: SecureCluster, token: str | None) -> None:
    good = bearer(secure.tokens["alice"])
    with secure.flight() as client:
        ticket = client.get_flight_info(statement(SQL), good).endpoints[0].ticket.ticket
        _every_rpc(client, bearer(token), ticket)


@pytest.mark.parametrize("token", [None, "lk_not-a-bound-token-0000000000"])
def test_data_plane_doget_needs_a_valid_token(
    secure: SecureCluster, data_plane: LakeProcess, token: str | None
) -> None:
    good = bearer(secure.tokens["alice"])
    with secure.flight(data_plane) as client:
        ticket = client.get_flight_info(statement(SQL), good).endpoints[0].ticket
    with secure.doget(data_plane) as client:
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(ticket, bearer(token)).read_all()
        # Refused before any ticket work: a garbage ticket gets the same answer.
        with pytest.raises(flight.FlightUnauthenticatedError, match="bearer token"):
            client.do_get(flight.Ticket(b"garbage"), bearer(token)).read_all()
        assert client.do_get(ticket, good).read_all().equals(expected_runs())


def _health(process: LakeProcess, token: str | None, server_name: str | None) -> int:
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    creds = grpc.ssl_channel_credentials(root_certificates=process.ca_pem)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.secure_channel(process.addr, creds, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(
            stub.Check(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=10).status
        )


def test_grpc_health_is_authenticated_on_both_services(secure: SecureCluster) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    assert _health(secure.query, secure.tokens["alice"], None) == serving
    assert _health(secure.meta, secure.tokens["query_service"], META_NAME) == serving
    for process, name, wrong in (
        (secure.query, None, secure.tokens["query_service"]),  # a Metasrv credential
        (secure.meta, META_NAME, secure.tokens["alice"]),  # a Query credential
    ):
        for token in (None, wrong):
            with pytest.raises(grpc.RpcError) as caught:
                _health(process, token, name)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_clients_cannot_talk_to_tls_listeners(secure: SecureCluster) -> None:
    for process in (secure.query, secure.meta):
        with grpc.insecure_channel(process.addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def _meta(secure: SecureCluster, token: str | None) -> MetaClient:
    return MetaClient(
        secure.meta.http_url, token=token, ca_pem=secure.ca.cert_pem, server_name=META_NAME
    )


def test_metasrv_authenticates_and_authorizes_by_role(secure: SecureCluster) -> None:
    async def go() -> None:
        for token in (None, secure.tokens["alice"], "lk_forged-token-0000000000000"):
            async with _meta(secure, token) as client:
                with pytest.raises(Unauthenticated):
                    await client.catalog_snapshot(None)
        async with _meta(secure, secure.tokens["query_service"]) as service:
            # The Query fleet's own credential reads the whole catalog for its cache...
            snapshot = await service.catalog_snapshot(None)
            assert {e.table for e in snapshot.tables} >= {RUNS, SECRETS}
            # ...but cannot administer, nor append without naming an end user.
            with pytest.raises(PermissionDenied):
                await service.create_table(TableRef("acme_ops", "new"), RUNS_SCHEMA)
            with pytest.raises(PermissionDenied):
                await service.drop_table(RUNS)
            cmd = protocol.AppendCommand(
                table=RUNS, operation_id="0190f1e2-0000-7000-8000-0000000000bb"
            )
            with pytest.raises(PermissionDenied):
                await service.append(cmd, RUNS_SCHEMA, [runs(0, 1)])
            # On behalf of a user, Metasrv authorizes that user's grants again.
            alice = Principal(
                principal_id="alice",
                tenant_id="acme",
                role="user",
                namespaces=frozenset({"acme_ops"}),
            )
            found = await service.describe_table(RUNS, on_behalf_of=alice)
            assert found.entry.table == RUNS
            with pytest.raises(PermissionDenied) as hidden:
                await service.describe_table(SECRETS, on_behalf_of=alice)
            with pytest.raises(PermissionDenied) as absent:
                await service.describe_table(TableRef("globex_ops", "nothing"), on_behalf_of=alice)
            assert str(hidden.value).replace("plans", "X") == str(absent.value).replace(
                "nothing", "X"
            )
            cmd = protocol.AppendCommand(
                table=SECRETS, operation_id="0190f1e2-0000-7000-8000-0000000000cc"
            )
            with pytest.raises(PermissionDenied):
                await service.append(cmd, RUNS_SCHEMA, [runs(0, 1)], on_behalf_of=alice)

    asyncio.run(go())


def test_sdk_builder_over_tls(secure: SecureCluster, serving: LakeProcess) -> None:
    url = serving.url.replace("grpc+tls://", "https://")
    token = secure.tokens["alice"]
    builder = (
        lake_sdk.Client.builder(url)
        .with_bearer_token(token)
        .with_ca_certificate_pem(secure.ca.cert_pem)
        .with_server_name("lake-query.test")
    )
    assert token not in repr(builder)
    before = data_plane_streams(serving)
    with builder.connect() as client:
        assert token not in repr(client)
        table = client.query_table(SQL)
        assert table.equals(expected_runs())
        # The SDK followed the data plane's location with its token, CA and server name.
        assert data_plane_streams(serving) - before == (serving is not secure.query)
        assert client.table_schema(RUNS).names == RUNS_SCHEMA.names
        with pytest.raises(PermissionDenied) as caught:
            client.query_table("SELECT * FROM globex_ops.plans")
        assert token not in str(caught.value)

    with pytest.raises(Unauthenticated) as wrong:
        lake_sdk.Client.builder(url).with_bearer_token(token[:-1] + "x").with_ca_certificate_pem(
            secure.ca.cert_pem
        ).connect()
    assert token[:-1] not in str(wrong.value)
    with pytest.raises(Unauthenticated):
        lake_sdk.Client.builder(url).with_ca_certificate_pem(secure.ca.cert_pem).connect()
    with pytest.raises(Unavailable):
        lake_sdk.Client.builder(url).with_bearer_token(token).with_timeout(2).connect()


def test_no_credential_reaches_a_server_log(secure: SecureCluster) -> None:
    # Wrong, near-miss and valid tokens have all been sent by now (test order
    # aside, this makes some of each); the fixture re-checks at teardown.
    with secure.flight() as client:
        for token in (secure.tokens["bob"][:-1] + "!", secure.tokens["bob"]):
            with contextlib.suppress(flight.FlightError):
                client.get_flight_info(statement(SQL), bearer(token))
    logs = secure.logs()
    for name, value in secure.tokens.items():
        assert value not in logs, name
        assert value[:-1] not in logs, name


def _query_exit(secure: SecureCluster, overrides: dict[str, str]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env.update({**secure.query_env, **overrides})
    addr = f"127.0.0.1:{free_port()}"
    args = ["-m", "lake_query", "--addr", addr, "--metadata-addr", secure.meta.http_url]
    proc = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stdout + proc.stderr


def _query_never_serves(
    secure: SecureCluster, overrides: dict[str, str], watch_s: float = 10.0
) -> str:
    """Start Query; it stays up but never loads a catalog (stopped by its pid); its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env.update({**secure.query_env, **overrides})
    addr = f"127.0.0.1:{free_port()}"
    args = ["-m", "lake_query", "--addr", addr, "--metadata-addr", secure.meta.http_url]
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(watch_s)  # nothing to wait for: the fact under test is an absence
        assert proc.poll() is None, "Query exited; a replica waits for Metasrv (start order)"
    finally:
        proc.terminate()
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
    return output


def test_query_verifies_metasrv_and_authenticates_to_it(
    secure: SecureCluster, tmp_path: Path
) -> None:
    # A certificate for another name: the TLS handshake fails. Query starts in any
    # order, so it stays up, but it never gets a catalog and never serves.
    output = _query_never_serves(secure, {"LAKE_METADATA_SERVER_NAME": "impostor.test"})
    assert "catalog loaded" not in output
    assert "not serving" in output
    # A token Metasrv does not know: refused, and the token is not in the output.
    wrong = "lk_wrong-service-token-000000000000"
    code, output = _query_exit(
        secure,
        {"LAKE_METADATA_AUTH_TOKEN_FILE": str(private_file(tmp_path / "wrong", wrong))},
    )
    assert code != 0
    assert "invalid bearer token" in output
    assert wrong not in output
    assert "listening" not in output
