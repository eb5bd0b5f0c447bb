"""A second ``lake meta`` or ``lake query`` on a served address refuses to start.

gRPC's default ``SO_REUSEPORT`` used to let the second process bind too, so
clients were split at random between the two. Now the second exits non-zero
naming the address, and the first keeps answering every call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import lake_sdk
from tools.lake_testing.data import ROBOTS, ROBOTS_SCHEMA, create_table
from tools.lake_testing.plugin import LakeCluster


def _second(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _serving(addr: str) -> bool:
    with grpc.insecure_channel(addr) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.mark.parametrize("service", ["meta", "query"])
def test_second_server_on_a_busy_address_exits_naming_it(
    lake_cluster: LakeCluster, tmp_path: Path, service: str
) -> None:
    create_table(lake_cluster.meta.addr, ROBOTS, ROBOTS_SCHEMA)
    if service == "meta":
        addr = lake_cluster.meta.addr
        args = ["-m", "lake_metasrv", "--addr", addr, "--data-dir", str(tmp_path / "other")]
    else:
        addr = lake_cluster.query.addr
        meta = f"http://{lake_cluster.meta.addr}"
        args = ["-m", "lake_query", "--addr", addr, "--metadata-addr", meta]
    code, output = _second(args, lake_cluster.env)
    assert code != 0, output
    assert addr in output, output
    assert "already in use" in output, output
    assert "listening" not in output
    # The first keeps serving: every fresh connection reaches the real catalog.
    for _ in range(8):
        assert _serving(addr)
        with lake_sdk.connect(lake_cluster.query.url) as sdk:
            assert sdk.table_schema(ROBOTS).names == ROBOTS_SCHEMA.names
