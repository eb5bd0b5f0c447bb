"""``client.scan``: shards of a pinned query, and the PyTorch recipe that wraps it."""

from __future__ import annotations

import asyncio
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lake_sdk
from tests.training.conftest import SAMPLE_ROWS, SAMPLES, Samples, rows_of

ROOT = Path(__file__).resolve().parents[2]
ALL = "SELECT * FROM training.samples"


def _rows(result: Any) -> pa.Table:
    return pa.Table.from_batches(list(result), schema=result.schema)


def test_four_shards_from_two_replicas_are_disjoint_and_exactly_the_result(
    samples: Samples,
) -> None:
    first, second = samples.cluster.queries

    async def async_shard(index: int) -> pa.Table:
        async with lake_sdk.AsyncClient(first.url) as client:
            return await (await client.scan(ALL, shard=(index, 4))).to_table()

    shards = [asyncio.run(async_shard(0))]
    with lake_sdk.Client(first.url) as a, lake_sdk.Client(second.url) as b:
        shards.append(_rows(a.scan(ALL, shard=(1, 4))))
        shards += [_rows(b.scan(ALL, shard=(i, 4))) for i in (2, 3)]
        again = _rows(b.scan(ALL, shard=(1, 4)))
        whole = a.query_table(ALL)  # every endpoint, one after another
    assert all(s.num_rows > 0 for s in shards)
    got = pa.concat_tables(shards)
    ids = got.column("id")
    assert len(ids.unique()) == len(ids) == samples.expected.num_rows  # disjoint
    assert rows_of(got).equals(samples.expected)
    assert rows_of(again).equals(rows_of(shards[1]))  # same pin, same rows, any replica
    assert rows_of(whole).equals(samples.expected)


def test_a_one_stream_query_goes_whole_to_shard_zero(samples: Samples) -> None:
    sql = "SELECT id FROM training.samples ORDER BY id DESC LIMIT 10"
    with lake_sdk.Client(samples.cluster.query.url) as client:
        first = client.scan(sql, shard=(0, 3)).to_table()
        rest = [client.scan(sql, shard=(i, 3)).to_table() for i in (1, 2)]
    assert first.column("id").to_pylist() == list(range(SAMPLE_ROWS - 1, SAMPLE_ROWS - 11, -1))
    assert [t.num_rows for t in rest] == [0, 0]
    assert all(t.schema.equals(first.schema) for t in rest)


@pytest.mark.parametrize("shard", [(4, 4), (-1, 2), (0, 0), (1,), [0, 2], (0.0, 2), (True, 2)])
def test_a_bad_shard_is_refused_before_any_call(shard: Any) -> None:
    client = lake_sdk.Client("grpc://127.0.0.1:1")
    with pytest.raises(lake_sdk.InvalidArgument, match="shard"):
        client.scan(ALL, shard=shard)


@pytest.mark.parametrize("as_of", [0, -3, True, "3", 1.5])
def test_a_bad_as_of_is_refused_before_any_call(as_of: Any) -> None:
    client = lake_sdk.Client("grpc://127.0.0.1:1")
    with pytest.raises(lake_sdk.InvalidArgument, match="as_of"):
        client.scan(ALL, as_of=as_of)


# -- the PyTorch recipe in docs/training.md, with a stand-in for torch ------------------


@dataclass
class _WorkerInfo:
    id: int
    num_workers: int


class _Torch:
    """What the recipe uses of torch: worker info, distributed rank, DataLoader."""

    def __init__(self) -> None:
        self.worker: _WorkerInfo | None = None
        self.rank: tuple[int, int] | None = None

    def modules(self) -> dict[str, types.ModuleType]:
        torch = types.ModuleType("torch")
        utils = types.ModuleType("torch.utils")
        data = types.ModuleType("torch.utils.data")
        dist = types.ModuleType("torch.distributed")

        class IterableDataset:
            pass

        @dataclass
        class DataLoader:
            dataset: Any
            batch_size: int | None = 1
            num_workers: int = 0

        data.IterableDataset = IterableDataset  # type: ignore[attr-defined]
        data.DataLoader = DataLoader  # type: ignore[attr-defined]
        data.get_worker_info = lambda: self.worker  # type: ignore[attr-defined]
        dist.is_available = lambda: True  # type: ignore[attr-defined]
        dist.is_initialized = lambda: self.rank is not None  # type: ignore[attr-defined]
        dist.get_rank = lambda: self.rank[0]  # type: ignore[attr-defined,index]
        dist.get_world_size = lambda: self.rank[1]  # type: ignore[attr-defined,index]
        torch.utils = utils  # type: ignore[attr-defined]
        torch.distributed = dist  # type: ignore[attr-defined]
        utils.data = data  # type: ignore[attr-defined]
        return {
            "torch": torch,
            "torch.utils": utils,
            "torch.utils.data": data,
            "torch.distributed": dist,
        }


def _recipe() -> str:
    page = (ROOT / "docs" / "training.md").read_text()
    section = page.split("## PyTorch recipe", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    return str(blocks[0])


def test_the_pytorch_recipe_gives_each_worker_of_each_rank_its_shard(
    samples: Samples, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _Torch()
    for name, module in fake.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    code = _recipe().replace("grpc://127.0.0.1:50051", samples.cluster.query.url)
    scope: dict[str, Any] = {"__name__": "recipe"}
    exec(compile(code, "docs/training.md", "exec"), scope)
    loader = scope["loader"]
    assert loader.batch_size is None
    assert loader.num_workers == 2

    # Two ranks of two workers each, as DataLoader and torch.distributed would run them.
    per_reader = []
    for rank in range(2):
        fake.rank = (rank, 2)
        for worker in range(loader.num_workers):
            fake.worker = _WorkerInfo(worker, loader.num_workers)
            per_reader.append(pa.Table.from_batches(list(loader.dataset)))
    got = pa.concat_tables(per_reader)
    assert all(t.num_rows > 0 for t in per_reader)
    assert len(got.column("id").unique()) == got.num_rows
    assert rows_of(got).equals(samples.expected)


def test_shards_of_an_older_version_are_exactly_that_version(samples: Samples) -> None:
    """``as_of`` pins every shard to one retained version; an append since changes nothing."""
    with lake_sdk.Client(samples.cluster.query.url) as client:
        # Concurrent appends share versions (commit groups): take an older version
        # the table lists, inside the default retention of 10.
        listed = client.versions(SAMPLES)["version"].to_pylist()
        older = sorted(listed)[-3]
        sql = "SELECT * FROM lake.training.samples"  # as_of rewrites qualified names
        shards = [_rows(client.scan(sql, as_of=older, shard=(i, 3))) for i in range(3)]
        whole = client.query_table(sql, as_of=older)
        current = client.query_table("SELECT count(*) AS n FROM training.samples")["n"][0]
    assert all(s.num_rows > 0 for s in shards)  # an old version splits like the current one
    got = pa.concat_tables(shards)
    assert 0 < got.num_rows < current.as_py()  # an older version: fewer rows than now
    assert got.num_rows % 10_000 == 0  # whole appends only
    assert len(got.column("id").unique()) == got.num_rows  # disjoint
    assert rows_of(got).equals(rows_of(whole))
