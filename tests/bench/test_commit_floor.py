"""The commit floor server makes exactly one Lance version per append, and nothing is lost."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import lance
import pyarrow.flight as flight
import pytest

from lake_core.cloud import DatasetStorage
from lake_core.config import MANIFEST_DYNAMODB_TABLE, STORAGE_TIMEOUT_MS
from tools.bench.commit_floor import FloorServer, floor_latencies, floor_rate
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3


def _datasets(root: Path) -> list[lance.LanceDataset]:
    return [lance.dataset(str(path)) for path in sorted(root.glob("*.lance"))]


def test_every_append_is_its_own_version_on_each_table(tmp_path: Path) -> None:
    root = tmp_path / "floor"
    with FloorServer(root) as floor:
        rate = floor_rate(floor.port, tables=2, count=24, in_flight=3)
    assert rate > 0
    datasets = _datasets(root)
    assert len(datasets) == 2
    ids: list[int] = []
    for dataset in datasets:
        # Version 1 is the empty dataset; each of the table's 12 appends made one more.
        assert dataset.version == 13
        assert dataset.count_rows() == 12
        assert len(dataset.get_fragments()) == 12
        ids.extend(dataset.to_table(columns=["id"]).column("id").to_pylist())
    assert sorted(ids) == list(range(24))


def test_one_writer_latencies_are_one_version_each(tmp_path: Path) -> None:
    root = tmp_path / "floor"
    with FloorServer(root) as floor:
        took = floor_latencies(floor.port, 5)
    assert len(took) == 5
    assert all(t > 0 for t in took)
    [dataset] = _datasets(root)
    assert (dataset.version, dataset.count_rows()) == (6, 5)


def test_the_durable_floor_makes_the_same_versions(tmp_path: Path) -> None:
    root = tmp_path / "floor"
    with FloorServer(root, durable=True) as floor:
        floor_rate(floor.port, tables=1, count=6, in_flight=2)
        took = floor_latencies(floor.port, 3)
    assert len(took) == 3
    datasets = _datasets(root)
    assert sorted((d.version, d.count_rows()) for d in datasets) == [(4, 3), (7, 6)]


def test_the_durable_floor_is_for_local_roots(tmp_path: Path) -> None:
    floor = FloorServer("s3://nowhere/floor", durable=True)
    try:
        with pytest.raises(RuntimeError, match="did not start"):
            floor.start()
    finally:
        floor.stop()


def test_the_server_is_stopped_by_its_pid(tmp_path: Path) -> None:
    floor = FloorServer(tmp_path / "floor").start()
    port = floor.port
    floor.stop()
    floor.stop()  # a second stop is a no-op
    with pytest.raises(flight.FlightUnavailableError):
        floor_rate(port, tables=1, count=1, in_flight=1)


def test_a_server_that_cannot_start_says_so(tmp_path: Path) -> None:
    # A storage setting out of range makes the child exit before it listens.
    env = {"PATH": "/usr/bin:/bin", STORAGE_TIMEOUT_MS.name: "0"}
    floor = FloorServer("s3://nowhere/floor", env)
    try:
        with pytest.raises(RuntimeError, match="did not start"):
            floor.start()
    finally:
        floor.stop()  # never leave a server behind, even when the test fails


@pytest.mark.s3
@pytest.mark.dynamodb
def test_in_cloud_mode_each_append_is_one_version_and_one_registry_step(
    s3_server: SeaweedS3,
    s3_bucket: str,
    dynamodb_server: Dynalite,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in s3_server.env().items():  # credentials for the manifest table's client
        monkeypatch.setenv(name, value)
    env = {
        **os.environ,
        **s3_server.env(),
        **dynamodb_server.env(),
        MANIFEST_DYNAMODB_TABLE: dynamodb_server.manifest_table(),
    }
    root = f"s3://{s3_bucket}/floor"
    with FloorServer(root, env, registry=True) as floor:
        floor_rate(floor.port, tables=2, count=10, in_flight=2)
    ddb = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_server.endpoint,
        region_name=dynamodb_server.region,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    (registry,) = [t for t in ddb.list_tables()["TableNames"] if t.startswith("floor_registry_")]
    heads = {i["pk"]["S"]: int(i["v"]["N"]) for i in ddb.scan(TableName=registry)["Items"]}
    assert sorted(heads.values()) == [5, 5]
    storage = DatasetStorage.from_env(env)
    for name in heads:
        location = f"{root}/{name}.lance"
        dataset = lance.dataset(
            storage.lance_uri(location), storage_options=storage.storage_options(location)
        )
        assert dataset.version == 6  # the empty dataset, then one version per append
        assert dataset.count_rows() == 5
