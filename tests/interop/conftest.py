"""Interop clients against both DoGet paths: grpcio, and Query's native data plane."""

from __future__ import annotations

import pytest

from lake_core.config import QUERY_DATA_ADDR
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import free_port, start_query


@pytest.fixture(params=["grpcio", "dataplane"])
def doget_cluster(lake_cluster: LakeCluster, request: pytest.FixtureRequest) -> LakeCluster:
    """``lake_cluster`` whose first Query replica serves DoGet on grpcio or its data plane."""
    if request.param == "dataplane":
        env = {**lake_cluster.env, QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}"}
        lake_cluster.queries.insert(
            0, start_query(lake_cluster.meta.addr, lake_cluster.root, env=env)
        )
    return lake_cluster
