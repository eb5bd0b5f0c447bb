"""The direct data-file reader: columns by field id, bounded readahead, typed failures.

Local Parquet files (pyarrow's own writer, with Iceberg field ids in the
footer) read through pyiceberg's local FileIO; no server needed.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, FileFormat
from pyiceberg.table import FileScanTask

from lake_iceberg.federation import reader as file_reader
from lake_iceberg.federation.reader import DataFileError, even_rows, read_files, reads_whole

SCHEMA = pa.schema([("id", pa.int64()), ("score", pa.float64()), ("site", pa.string())])
IDS = [1, 2, 3]


def _field(name: str, kind: pa.DataType, field_id: int | None) -> pa.Field:
    metadata = None if field_id is None else {"PARQUET:field_id": str(field_id)}
    return pa.field(name, kind, metadata=metadata)


def _write(path: Path, table: pa.Table) -> FileScanTask:
    pq.write_table(table, path, row_group_size=3)
    data_file = DataFile.from_args(
        file_path=str(path), file_format=FileFormat.PARQUET, spec_id=0, record_count=table.num_rows
    )
    return FileScanTask(data_file)


def _old_file(path: Path, ids: list[int]) -> FileScanTask:
    """Written before ``score`` was renamed (from ``reward``, an int then) and ``site`` added."""
    schema = pa.schema([_field("id", pa.int64(), 1), _field("reward", pa.int32(), 2)])
    return _write(path, pa.table({"id": ids, "reward": [i * 10 for i in ids]}, schema=schema))


def test_columns_are_found_by_field_id_and_cast_to_the_promised_types(tmp_path: Path) -> None:
    old = _old_file(tmp_path / "old.parquet", [1, 2, 3, 4, 5])
    new_schema = pa.schema(
        [
            _field("site", pa.large_string(), 3),  # another column order, a large type
            _field("id", pa.int64(), 1),
            _field("score", pa.float64(), 2),
        ]
    )
    new = _write(
        tmp_path / "new.parquet",
        pa.table({"site": ["lab", None], "id": [6, 7], "score": [0.5, 1.5]}, schema=new_schema),
    )
    rows = pa.Table.from_batches(
        list(read_files(PyArrowFileIO(), [old, new], IDS, SCHEMA, batch_rows=2)), schema=SCHEMA
    )
    assert rows.schema == SCHEMA
    assert rows.to_pylist() == [
        *({"id": i, "score": float(i * 10), "site": None} for i in range(1, 6)),
        {"id": 6, "score": 0.5, "site": "lab"},
        {"id": 7, "score": 1.5, "site": None},
    ]


def test_files_without_field_ids_use_the_name_mapping(tmp_path: Path) -> None:
    plain = pa.schema([_field("id", pa.int64(), None), _field("points", pa.float64(), None)])
    task = _write(tmp_path / "plain.parquet", pa.table({"id": [1], "points": [2.5]}, schema=plain))
    got = read_files(
        PyArrowFileIO(), [task], IDS, SCHEMA, batch_rows=8, mapping={"id": 1, "points": 2}
    )
    assert pa.Table.from_batches(list(got)).to_pylist() == [{"id": 1, "score": 2.5, "site": None}]


def test_only_missing_columns_still_count_every_row(tmp_path: Path) -> None:
    task = _old_file(tmp_path / "old.parquet", list(range(7)))
    site = pa.schema([("site", pa.string())])
    got = list(read_files(PyArrowFileIO(), [task], [3], site, batch_rows=4))
    assert sum(b.num_rows for b in got) == 7
    assert all(b.schema == site and b.column(0).null_count == b.num_rows for b in got)


class GatedIO(PyArrowFileIO):
    """Counts files opened; each open waits for the test's gate."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []
        self.gate = threading.Event()
        self._cond = threading.Condition()

    def new_input(self, location: str) -> Any:
        with self._cond:
            self.opened.append(location)
            self._cond.notify_all()
        self.gate.wait(30)
        return super().new_input(location)

    def wait_opened(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.opened) >= count, 30), self.opened


@pytest.fixture
def files(tmp_path: Path) -> list[FileScanTask]:
    return [_old_file(tmp_path / f"f{n}.parquet", [n * 10 + i for i in range(6)]) for n in range(8)]


def test_at_most_readahead_files_are_in_flight(files: list[FileScanTask]) -> None:
    io = GatedIO()
    batches: Iterator[pa.RecordBatch] = read_files(io, files, IDS, SCHEMA, 3, readahead=3)
    first = threading.Thread(target=lambda: next(batches))
    first.start()
    io.wait_opened(3)
    # All three readers wait at the gate: no fourth file may have been started.
    assert len(io.opened) == 3
    io.gate.set()
    first.join(30)
    rows = 3 + sum(b.num_rows for b in batches)
    assert rows == 8 * 6
    assert io.opened == [f.file.file_path for f in files]  # each file once, in order


def test_closing_the_stream_stops_the_readers(files: list[FileScanTask]) -> None:
    io = GatedIO()
    io.gate.set()
    batches = read_files(io, files, IDS, SCHEMA, 1, readahead=2)
    next(batches)
    readers = [t for t in threading.enumerate() if t.name.startswith("lake-iceberg-read")]
    assert readers  # blocked on their full buffers (two batches of six rows each)
    batches.close()  # type: ignore[attr-defined]
    for reader in readers:
        reader.join(30)
        assert not reader.is_alive()
    assert len(io.opened) == 2  # no file started beyond the two in flight


def test_a_missing_file_fails_typed_with_its_cause(
    tmp_path: Path, files: list[FileScanTask]
) -> None:
    Path(files[2].file.file_path).unlink()
    with pytest.raises(DataFileError) as caught:
        list(read_files(PyArrowFileIO(), files, IDS, SCHEMA, 4))
    assert isinstance(caught.value.cause, FileNotFoundError)
    assert caught.value.path == files[2].file.file_path


def test_an_undecodable_file_fails_typed(files: list[FileScanTask]) -> None:
    Path(files[0].file.file_path).write_bytes(b"PAR1 not really parquet PAR1")
    with pytest.raises(DataFileError) as caught:
        list(read_files(PyArrowFileIO(), files, IDS, SCHEMA, 4))
    assert isinstance(caught.value.cause, pa.ArrowInvalid)  # undecodable, not an I/O fault


def test_a_row_group_is_cut_into_equal_batches(tmp_path: Path) -> None:
    # Equal batches: no short tail for the Flight coalescer to merge (copy) into the next one.
    table = pa.table({"id": list(range(9)), "score": [0.5] * 9, "site": ["lab"] * 9})
    path = tmp_path / "nine.parquet"
    task = FileScanTask(
        DataFile.from_args(
            file_path=str(path), file_format=FileFormat.PARQUET, spec_id=0, record_count=9
        )
    )
    schema = pa.schema([_field(f.name, f.type, i) for i, f in zip(IDS, SCHEMA, strict=True)])
    pq.write_table(table.cast(schema), path, row_group_size=9)
    batches = list(read_files(PyArrowFileIO(), [task], IDS, SCHEMA, batch_rows=4))
    assert [b.num_rows for b in batches] == [3, 3, 3]  # not 4, 4, 1
    assert [even_rows(n, 4) for n in (0, 1, 4, 5, 8, 9, 100_000)] == [1, 1, 4, 3, 4, 3, 4]
    assert even_rows(100_000, 41_704) == 33_334


def _sized(path: Path, table: pa.Table, row_group_size: int) -> FileScanTask:
    """A data file as a manifest records it: with its size and its columns' sizes."""
    pq.write_table(table, path, row_group_size=row_group_size)
    chunks: dict[int, int] = {}
    metadata = pq.ParquetFile(path).metadata
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            chunks[column + 1] = chunks.get(column + 1, 0) + chunk.total_compressed_size
    data_file = DataFile.from_args(
        file_path=str(path),
        file_format=FileFormat.PARQUET,
        spec_id=0,
        record_count=table.num_rows,
        file_size_in_bytes=path.stat().st_size,
        column_sizes=chunks,
    )
    return FileScanTask(data_file)


def _generated(rng: random.Random, rows: int) -> pa.Table:
    schema = pa.schema([_field(f.name, f.type, i) for i, f in zip(IDS, SCHEMA, strict=True)])

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    return pa.table(
        {
            "id": [maybe(rng.randint(-(2**63), 2**63 - 1)) for _ in range(rows)],
            "score": [maybe(rng.choice([rng.uniform(-1, 1), math.nan, -0.0])) for _ in range(rows)],
            "site": [
                maybe(rng.choice(["", "lab", "Ωmega", "x" * rng.randint(0, 40)]))
                for _ in range(rows)
            ],
        },
        schema=schema,
    )


def _exact(batches: list[pa.RecordBatch]) -> list[list[str]]:
    """Each batch's rows, every value by ``repr`` (NaN equals NaN, -0.0 differs from 0.0)."""
    return [[repr(row) for row in batch.to_pylist()] for batch in batches]


@pytest.mark.parametrize("seed", range(4))
def test_a_file_read_whole_streams_what_ranged_reads_stream(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Differential: the one-request read of a small file against pre-buffered ranges.
    rng = random.Random(seed)
    tasks = [
        _sized(tmp_path / f"g{n}.parquet", _generated(rng, rng.randint(0, 300)), rng.randint(1, 64))
        for n in range(5)
    ]
    batch_rows = rng.randint(1, 50)
    for projection in ([1, 2, 3], [3, 1]):
        schema = pa.schema([SCHEMA.field(i - 1) for i in projection])
        assert all(reads_whole(t.file, projection, t.file.file_size_in_bytes) for t in tasks)
        whole = list(read_files(PyArrowFileIO(), tasks, projection, schema, batch_rows))
        with monkeypatch.context() as patched:
            patched.setattr(file_reader, "WHOLE_FILE_BYTES", 0)  # every file by ranges
            ranged = list(read_files(PyArrowFileIO(), tasks, projection, schema, batch_rows))
        assert [b.num_rows for b in whole] == [b.num_rows for b in ranged]
        assert all(a.schema == b.schema == schema for a, b in zip(whole, ranged, strict=True))
        assert _exact(whole) == _exact(ranged)
        assert sum(b.num_rows for b in whole) == sum(t.file.record_count for t in tasks)


def test_only_small_files_mostly_read_are_fetched_whole(tmp_path: Path) -> None:
    sites = [f"{i:0200d}" for i in range(1000)]  # distinct: no dictionary makes them small
    wide = pa.table({"id": list(range(1000)), "score": [0.5] * 1000, "site": sites})
    task = _sized(
        tmp_path / "wide.parquet",
        wide.cast(
            pa.schema([_field(f.name, f.type, i) for i, f in zip(IDS, wide.schema, strict=True)])
        ),
        1000,
    )
    size = task.file.file_size_in_bytes
    assert reads_whole(task.file, IDS, size)
    assert reads_whole(task.file, [3], size)  # the strings are most of the file
    assert not reads_whole(task.file, [1], size)  # a narrow projection reads its chunks only
    assert not reads_whole(task.file, IDS, file_reader.WHOLE_FILE_BYTES + 1)  # large: by ranges
    unsized = _write(tmp_path / "unsized.parquet", wide)  # no column sizes recorded
    assert not reads_whole(unsized.file, IDS, size)


def test_a_missing_small_file_fails_typed_with_its_cause(tmp_path: Path) -> None:
    tasks = [
        _sized(tmp_path / f"m{n}.parquet", _generated(random.Random(n), 20), 8) for n in range(3)
    ]
    Path(tasks[1].file.file_path).unlink()
    with pytest.raises(DataFileError) as caught:
        list(read_files(PyArrowFileIO(), tasks, IDS, SCHEMA, 4))
    assert isinstance(caught.value.cause, FileNotFoundError)
    assert caught.value.path == tasks[1].file.file_path


def test_an_undecodable_small_file_fails_typed(tmp_path: Path) -> None:
    task = _sized(tmp_path / "bad.parquet", _generated(random.Random(7), 20), 8)
    Path(task.file.file_path).write_bytes(b"PAR1 not really parquet PAR1")
    assert reads_whole(task.file, IDS, 28)
    with pytest.raises(DataFileError) as caught:
        list(read_files(PyArrowFileIO(), [task], IDS, SCHEMA, 4))
    assert isinstance(caught.value.cause, pa.ArrowInvalid)


class PythonFileIO(PyArrowFileIO):
    """Opens files as Python file objects, as another FileIO (fsspec's) does."""

    def new_input(self, location: str) -> Any:
        class Input:
            def open(self, seekable: bool = True) -> Any:
                return open(location, "rb")  # the reader closes it

        return Input()


def test_another_file_io_reads_by_ranges(tmp_path: Path) -> None:
    tasks = [
        _sized(tmp_path / f"p{n}.parquet", _generated(random.Random(n), 50), 16) for n in range(3)
    ]
    expected = list(read_files(PyArrowFileIO(), tasks, IDS, SCHEMA, 7))
    assert _exact(list(read_files(PythonFileIO(), tasks, IDS, SCHEMA, 7))) == _exact(expected)
