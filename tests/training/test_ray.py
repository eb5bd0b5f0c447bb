"""Ray Data over Lake (lake_sdk.ray): one read task per endpoint of one pinned plan.

A local Ray (two CPUs, its own temp dir) reads the 400,000-row, 7-endpoint
``training.samples`` table behind two replicas. The dataset must equal the
statement's own result, row for row, however Ray schedules or retries tasks.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest

import lake_sdk
from lake_core.errors import InvalidArgument, TableNotFound
from tests.training.conftest import SAMPLES_SCHEMA, Samples, rows_of
from tools.lake_testing.ray_local import local_ray
from tools.lake_testing.waiting import until

ray = pytest.importorskip("ray")  # in the test environment always (hatch.toml); the SDK extra
from lake_sdk.ray import LakeDatasource, read_lake  # noqa: E402

ALL = "SELECT * FROM training.samples"


@pytest.fixture(scope="module")
def ray_dir() -> Iterator[Path]:
    with local_ray(num_cpus=2, worker_niceness=0) as temp:
        yield temp


def collect(dataset: Any) -> pa.Table:
    batches = list(dataset.iter_batches(batch_format="pyarrow", batch_size=65536))
    return pa.concat_tables(batches) if batches else pa.table({})


def test_one_read_task_per_endpoint_and_the_rows_equal_the_result(
    samples: Samples, ray_dir: Path
) -> None:
    url = samples.cluster.queries[1].url  # planned on the replica that does not write
    source = LakeDatasource(ALL, url=url)
    assert source.endpoint_count == 7
    tasks = source.get_read_tasks(parallelism=2)
    assert len(tasks) == 7
    assert source.schema.equals(SAMPLES_SCHEMA)
    dataset = read_lake(ALL, url=url)
    got = collect(dataset)
    assert got.num_rows == samples.expected.num_rows
    assert rows_of(got).equals(samples.expected)


def test_read_tasks_yield_contiguous_blocks_just_over_the_context_block_size(
    samples: Samples, ray_dir: Path
) -> None:
    # iter_batches copies every multi-chunk block it slices (Ray's Batcher combines its
    # chunks first), so a read task hands Ray blocks of one chunk per column, each just
    # over the context's target_max_block_size (smaller ones Ray would merge again).
    url = samples.cluster.query.url
    ordered = f"{ALL} ORDER BY id"  # one endpoint, streamed in many batches
    with lake_sdk.Client(url) as client:
        info = client.plan(ordered)
        sizes = [
            chunk.data.nbytes for chunk in flight.connect(url).do_get(info.endpoints[0].ticket)
        ]
    assert len(sizes) > 3, "Query sent the rows in few batches: nothing would be combined"
    source = LakeDatasource(ordered, url=url)
    context = ray.data.DataContext.get_current().copy()
    context.target_max_block_size = 2 * max(sizes)  # a block spans several batches
    [task] = source.get_read_tasks(2, data_context=context)
    *full, last = task.read_fn()
    assert full, "the rows fit one block: nothing was checked"
    assert len(sizes) > len(full) + 1, "no block spanned several batches: nothing was combined"
    assert all(block.nbytes > context.target_max_block_size for block in full)
    for block in [*full, last]:
        assert all(column.num_chunks == 1 for column in block.columns)
    assert pa.concat_tables([*full, last]).equals(samples.expected.sort_by("id"))


def test_projection_limit_and_map_batches_pass_through(samples: Samples, ray_dir: Path) -> None:
    url = samples.cluster.query.url
    sql = "SELECT * FROM training.samples WHERE label = 3"
    projected = collect(read_lake(sql, url=url, columns=["id", "label"]))
    assert projected.column_names == ["id", "label"]
    expected = samples.expected.filter(pc.equal(samples.expected["label"], 3))
    assert rows_of(projected).equals(rows_of(expected.select(["id", "label"])))

    limited = collect(read_lake(f"{sql} -- a trailing comment", url=url, limit=1000))
    assert limited.num_rows == 1000
    assert pc.all(pc.equal(limited["label"], 3)).as_py()

    def double(batch: pa.Table) -> pa.Table:
        return batch.append_column("twice", pc.multiply(batch["id"], 2))

    mapped = collect(read_lake(sql, url=url).map_batches(double, batch_format="pyarrow"))
    assert mapped.num_rows == expected.num_rows
    assert pc.all(pc.equal(mapped["twice"], pc.multiply(mapped["id"], 2))).as_py()


def test_iter_torch_batches_when_torch_is_present(samples: Samples, ray_dir: Path) -> None:
    pytest.importorskip("torch")  # never installed here (8 GB); runs where a team has it
    dataset = read_lake(ALL, url=samples.cluster.query.url, columns=["id", "value"], limit=4096)
    total = sum(len(b["id"]) for b in dataset.iter_torch_batches(batch_size=1024))
    assert total == 4096


class _CrashOnce(LakeDatasource):
    """Lake's read tasks, with the worker killed mid-read on its first attempt at task 0."""

    def __init__(self, marker: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._marker = str(marker)

    def get_read_tasks(self, parallelism: int, *args: Any, **kwargs: Any) -> list[Any]:
        from ray.data.datasource import ReadTask

        tasks = super().get_read_tasks(parallelism, *args, **kwargs)
        marker = self._marker

        def crashing(read: Any) -> Any:
            def run() -> Iterator[pa.Table]:
                sent = 0
                for table in read():
                    for start in range(0, table.num_rows, 10_000):
                        yield table.slice(start, 10_000)
                        sent += 1
                        if sent == 3 and not os.path.exists(marker):
                            Path(marker).touch()
                            os._exit(1)  # the worker dies with blocks already sent

            return run

        first = tasks[0]
        tasks[0] = ReadTask(crashing(first.read_fn), first.metadata, schema=first.schema)
        return tasks


def test_a_worker_killed_mid_read_is_retried_and_every_row_arrives_once(
    samples: Samples, ray_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "crashed"
    source = _CrashOnce(marker, ALL, url=samples.cluster.query.url)
    dataset = ray.data.read_datasource(source, override_num_blocks=source.endpoint_count)
    got = collect(dataset)
    assert marker.exists(), "the fault never fired: the test proved nothing"
    assert got.num_rows == samples.expected.num_rows
    assert rows_of(got).equals(samples.expected)


class _Noting(LakeDatasource):
    """Lake's read tasks, each noting in ``notes`` what Ray gave it and who ran beside it.

    A task marks itself running (``running-<i>``) for as long as it reads,
    and writes ``task-<i>.json``: the resources Ray assigned it, its nice
    value and the other tasks running as it started. ``meet``: tasks 0 and
    1 each wait until the other is running, which only tasks that Ray runs
    at once can do.
    """

    def __init__(self, notes: Path, meet: bool, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._notes, self._meet = str(notes), meet

    def get_read_tasks(self, parallelism: int, *args: Any, **kwargs: Any) -> list[Any]:
        from ray.data.datasource import ReadTask

        tasks = super().get_read_tasks(parallelism, *args, **kwargs)
        notes, meet = Path(self._notes), self._meet

        def noting(index: int, read: Any) -> Any:
            def run() -> Iterator[pa.Table]:
                running = notes / f"running-{index}"
                running.touch()
                beside = sorted(p.name for p in notes.glob("running-*") if p != running)
                held = ray.get_runtime_context().get_assigned_resources()
                nice = os.getpriority(os.PRIO_PROCESS, 0)
                note = {"held": held, "beside": beside, "nice": nice}
                (notes / f"task-{index}.json").write_text(json.dumps(note))
                if meet and index < 2:
                    other = notes / f"running-{1 - index}"
                    until(other.exists, 60, f"read task {1 - index} running beside {index}")
                try:
                    yield from read()
                finally:
                    running.unlink()

            return run

        return [
            ReadTask(noting(i, t.read_fn), t.metadata, schema=t.schema) for i, t in enumerate(tasks)
        ]


def read_noting(
    monkeypatch: pytest.MonkeyPatch, url: str, notes: Path, meet: bool, **options: Any
) -> tuple[pa.Table, list[dict[str, Any]]]:
    """``read_lake`` of every row through :class:`_Noting`; the rows and each task's note.

    Ray Data's per-operator budget is off here: it comes from Ray's
    autoscaling coordinator, which on busy cores can grant a new execution
    nothing for minutes ("Cluster resources are not enough to run any
    task"), and Ray then runs one task at a time whatever ``num_cpus`` and
    ``concurrency`` say. What these tests check, the resources and the cap
    ``read_lake`` hands Ray, is then all that decides what runs at once.
    """
    import lake_sdk.ray

    notes.mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(lake_sdk.ray, "LakeDatasource", lambda *a, **k: _Noting(notes, meet, *a, **k))
        context = ray.data.DataContext.get_current()
        patch.setattr(context, "op_resource_reservation_enabled", False)
        got = collect(read_lake(ALL, url=url, **options))
    taken = sorted(notes.glob("task-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return got, [json.loads(p.read_text()) for p in taken]


def test_num_cpus_is_what_each_read_task_holds(
    samples: Samples, ray_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = samples.cluster.query.url
    got, notes = read_noting(monkeypatch, url, tmp_path / "default", False)
    assert rows_of(got).equals(samples.expected)
    assert len(notes) == 7  # one read task per endpoint, whatever the resources
    assert all(note["held"].get("CPU") == 1.0 for note in notes), notes

    got, notes = read_noting(monkeypatch, url, tmp_path / "none", False, num_cpus=0)
    assert rows_of(got).equals(samples.expected)
    assert len(notes) == 7
    assert all(not note["held"].get("CPU") for note in notes), notes

    got, notes = read_noting(monkeypatch, url, tmp_path / "half", False, num_cpus=0.5)
    assert rows_of(got).equals(samples.expected)
    assert all(note["held"].get("CPU") == 0.5 for note in notes), notes


def test_concurrency_caps_the_read_tasks_running_at_once(
    samples: Samples, ray_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = samples.cluster.query.url
    # Uncapped, tasks that hold no CPU run at once (0 and 1 wait for each other)...
    got, notes = read_noting(monkeypatch, url, tmp_path / "free", True, num_cpus=0)
    assert rows_of(got).equals(samples.expected)
    assert notes[0]["beside"] or notes[1]["beside"], notes
    # ...so capped at one, a task that ever found another running would show it.
    got, notes = read_noting(monkeypatch, url, tmp_path / "one", False, num_cpus=0, concurrency=1)
    assert rows_of(got).equals(samples.expected)
    assert len(notes) == 7
    assert all(note["beside"] == [] for note in notes), notes


@pytest.mark.parametrize(
    "options",
    [
        {"num_cpus": -1},
        {"num_cpus": math.nan},
        {"num_cpus": math.inf},
        {"num_cpus": True},
        {"num_cpus": "1"},
        {"concurrency": 0},
        {"concurrency": 1.5},
        {"concurrency": True},
    ],
)
def test_bad_resource_options_are_invalid_arguments_before_planning(
    samples: Samples, ray_dir: Path, options: dict[str, Any]
) -> None:
    name = next(iter(options))
    # No such table: planning would raise TableNotFound, so the check came first.
    with pytest.raises(InvalidArgument, match=name):
        read_lake("SELECT * FROM training.no_such_table", url=samples.cluster.query.url, **options)


def test_planning_errors_are_lake_errors_in_the_caller(samples: Samples, ray_dir: Path) -> None:
    with pytest.raises(TableNotFound):
        read_lake("SELECT * FROM training.no_such_table", url=samples.cluster.query.url)


def test_the_docs_example_runs(samples: Samples, ray_dir: Path, capsys: Any) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    section = page.split("## Ray Data\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, re.S)
    code = block.replace("grpc://127.0.0.1:50051", samples.cluster.query.url)
    for _ in (1, 2):  # twice, as a reader reruns a page (ray.init tolerates the running Ray)
        exec(compile(code, "docs/training.md", "exec"), {"__name__": "__main__"})
    expected = pc.sum(pc.less(samples.expected["label"], 5)).as_py()
    assert capsys.readouterr().out.split("\n")[:2] == [f"{expected} rows through Ray"] * 2
