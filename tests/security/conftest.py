"""One secured Lake (TLS, principal maps, two tenants) shared by this directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import lake_sdk
from tests.security.cluster import (
    ROWS,
    RUNS,
    RUNS_SCHEMA,
    SECRETS,
    SECRETS_SCHEMA,
    SecureCluster,
    plans,
    runs,
    start_secure_cluster,
)
from tools.lake_testing.servers import LakeProcess

#: The two ways a replica serves DoGet: grpcio on its listener, or the native data plane.
DOGET_PATHS = ["grpcio", "dataplane"]


def sdk(cluster: SecureCluster, user: str) -> lake_sdk.Client:
    return (
        lake_sdk.Client.builder(cluster.query.url.replace("grpc+tls://", "https://"))
        .with_bearer_token(cluster.tokens[user])
        .with_ca_certificate_pem(cluster.ca.cert_pem)
        .connect()
    )


@pytest.fixture(scope="session")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    cluster = start_secure_cluster(tmp_path_factory.mktemp("secure"))
    try:
        cluster.admin_call(lambda c: c.create_table(RUNS, RUNS_SCHEMA))
        cluster.admin_call(lambda c: c.create_table(SECRETS, SECRETS_SCHEMA))
        with sdk(cluster, "alice") as alice:
            assert alice.append_batches(RUNS, [runs(0, ROWS)]) == 1
        with sdk(cluster, "bob") as bob:
            assert bob.append_batches(SECRETS, [plans()]) == 1
        yield cluster
    finally:
        cluster.stop()
    # Whatever the tests did (wrong tokens included), no credential reached a log.
    logs = cluster.logs()
    assert logs, "the servers wrote no logs"
    for name, value in cluster.tokens.items():
        assert value not in logs, f"the {name} token appears in a server log"


@pytest.fixture(scope="session")
def data_plane(secure: SecureCluster) -> Iterator[LakeProcess]:
    """A replica of the secure fleet (same key ring) with its native data plane on."""
    replica = secure.add_data_plane("dataplane")
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture(params=DOGET_PATHS)
def serving(request: pytest.FixtureRequest, secure: SecureCluster) -> LakeProcess:
    """The replica that redeems a test's tickets, once per DoGet path (redeem with ``doget``)."""
    if request.param == "grpcio":
        return secure.query
    replica: LakeProcess = request.getfixturevalue("data_plane")
    return replica
