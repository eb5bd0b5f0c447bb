"""A hostile REST catalog cannot hold a planner, fill its memory or pass for the caller.

A tiny threaded HTTP server impersonates the catalog: the config handshake and
namespace checks answer normally, table loads answer as each test scripts
them (a body dripped a byte at a time, an endless body, JSON nested past
Python's recursion limit, metadata pyiceberg refuses or that names a
current snapshot it does not list). Each must fail with ``Unavailable`` (a
catalog fault, never the caller's) within about one
``LAKE_ICEBERG_REST_TIMEOUT_MS``, without quoting the document.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from lake_core.errors import Unavailable
from lake_iceberg.federation import FederationConfig, IcebergFederation
from tools.lake_testing.rest_catalog import Answer, FakeCatalog, send_json, serving

pytestmark = [pytest.mark.iceberg]


@pytest.fixture
def hostile() -> Iterator[FakeCatalog]:
    with serving(lambda handler: send_json(handler, 200, b"{}")) as server:
        yield server


def _federation(server: FakeCatalog) -> IcebergFederation:
    config = FederationConfig.from_env(
        {
            "LAKE_ICEBERG_REST_ENDPOINT": server.endpoint,
            "LAKE_ICEBERG_WAREHOUSE": "s3://wh/",
            "LAKE_ICEBERG_NAMESPACES": "ns",
            "LAKE_ICEBERG_REST_TIMEOUT_MS": "1000",
        }
    )
    assert config is not None
    federation = IcebergFederation(config)
    federation.start()
    return federation


def _drip(length: int | None) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if length is None:
            handler.send_header("Transfer-Encoding", "chunked")
        else:
            handler.send_header("Content-Length", str(length))
        handler.end_headers()
        for _ in range(120):  # a byte every 0.25 s: each read is well within the timeout
            handler.wfile.write(b"1\r\n \r\n" if length is None else b" ")
            handler.wfile.flush()
            time.sleep(0.25)

    return answer


def _endless(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()  # no length: the body ends when the connection does
    handler.wfile.write(b'{"metadata-location": "s3://wh/m.json", "metadata": {"x": "')
    chunk = b"A" * (1 << 20)
    for _ in range(2048):  # 2 GiB, as fast as the client reads
        handler.wfile.write(chunk)


@pytest.mark.parametrize(
    "answer", [_drip(120), _drip(None), _endless], ids=["drip-length", "drip-chunked", "endless"]
)
def test_a_slow_or_endless_table_load_is_unavailable_within_the_timeout(
    hostile: FakeCatalog, answer: Answer
) -> None:
    hostile.answer = answer
    federation = _federation(hostile)
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            federation.plan("ns", "t")
        assert time.monotonic() - started < 5  # about one timeout, not the whole answer
    finally:
        federation.close()


def test_json_nested_past_the_recursion_limit_is_a_malformed_load(hostile: FakeCatalog) -> None:
    hostile.answer = lambda handler: send_json(handler, 200, b"[" * 100_000 + b"]" * 100_000)
    federation = _federation(hostile)
    try:
        with pytest.raises(Unavailable, match="malformed"):
            federation.plan("ns", "t")
    finally:
        federation.close()


def _metadata(**changes: object) -> dict[str, object]:
    """A minimal, valid v2 table metadata document with ``changes`` applied (None: removed)."""
    metadata: dict[str, object] = {
        "format-version": 2,
        "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
        "location": "s3://wh/ns/t",
        "last-sequence-number": 0,
        "last-updated-ms": 1,
        "last-column-id": 1,
        "current-schema-id": 0,
        "schemas": [
            {
                "type": "struct",
                "schema-id": 0,
                "fields": [{"id": 1, "name": "x", "required": False, "type": "long"}],
            }
        ],
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": {"owner-secret": "do-not-echo"},
        "snapshots": [],
    }
    for key, value in changes.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return metadata


@pytest.mark.parametrize(
    "changes",
    [
        {"format-version": 9},
        {"format-version": None},
        {"current-schema-id": 77},
        {"current-snapshot-id": 12345},
    ],
    ids=["unknown-format", "no-format", "unlisted-schema", "unlisted-snapshot"],
)
def test_inconsistent_metadata_is_the_catalogs_fault(
    hostile: FakeCatalog, changes: dict[str, object]
) -> None:
    document = {"metadata-location": "s3://wh/ns/t/m.json", "metadata": _metadata(**changes)}
    body = json.dumps(document).encode()
    hostile.answer = lambda handler: send_json(handler, 200, body)
    federation = _federation(hostile)
    try:
        with pytest.raises(Unavailable, match="unreadable metadata") as caught:
            federation.plan("ns", "t")
        assert "do-not-echo" not in str(caught.value)
    finally:
        federation.close()


def test_the_minimal_document_itself_plans(hostile: FakeCatalog) -> None:
    body = json.dumps({"metadata-location": "s3://wh/m.json", "metadata": _metadata()}).encode()
    hostile.answer = lambda handler: send_json(handler, 200, body)
    federation = _federation(hostile)
    try:
        assert federation.plan("ns", "t").snapshot_id is None
    finally:
        federation.close()
