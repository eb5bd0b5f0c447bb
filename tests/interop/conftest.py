"""Interop clients against both DoGet paths: grpcio, and Query's native data plane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lake_core.config import QUERY_DATA_ADDR
from tools.lake_testing.plugin import LakeCluster, cluster_env
from tools.lake_testing.servers import free_port, meta_process, query_process, start_together


@pytest.fixture(params=["grpcio", "dataplane"])
def doget_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LakeCluster]:
    """``lake_cluster`` whose Query replica serves DoGet on grpcio or its data plane."""
    env = cluster_env(tmp_path)
    meta = meta_process(tmp_path / "data", tmp_path, env=env)
    replica_env = dict(env)
    if request.param == "dataplane":
        replica_env[QUERY_DATA_ADDR] = f"127.0.0.1:{free_port()}"
    replica = query_process(meta.addr, tmp_path, env=replica_env)
    start_together(meta, replica)
    cluster = LakeCluster(root=tmp_path, meta=meta, queries=[replica], env=env)
    try:
        yield cluster
    finally:
        cluster.stop()
