"""The ``t$versions`` walk's steps, read from the small ends of Lance's files.

Each step of the walk (:func:`lake_query.planning.versions.history`) needs of
one Lance version its commit time and its transaction. Through Lance, that
costs decoding the version's whole manifest, which lists every fragment of the
table: on a table appended all day and not compacted, version N's manifest
holds N fragments, and listing 3,000 versions decoded ~360 MB of them (over
20 s, past the planning deadline). The listing needs none of the fragments:

- The manifest (protobuf ``lance.table.Manifest``, then a 16-byte footer
  ending in ``LANC``) is written fragments first; the version number (field
  3), the commit timestamp (field 7) and the transaction file's name (field
  12) follow them, in its last few hundred bytes.
- The transaction file ``_transactions/<read_version>-<uuid>.txn`` (protobuf
  ``lance.table.Transaction``) is small: the read version (field 1), its
  properties (field 4, where Metasrv names the appends) and the operation
  (Append 100, Overwrite 102, Restore 106, anything else maintenance).

So a listing lists ``_versions/`` once and reads, in parallel, the last
:data:`TAIL_BYTES` of each manifest at or below the head and its transaction
file, then walks in memory. Whatever this cannot decode with certainty (a
version not listed, an unexpected layout, a create, whose rows only its
manifest totals) is read through Lance for that one step: slower, never
different. The walk still follows each version's read version from the
head, so what it lists is exactly what it listed before: versions
retention reclaimed end it, and orphans a Restore was written over, or an
append never made visible, are never reached.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pyarrow.fs as pafs

from lake_core.cloud import DatasetStorage
from lake_core.models import TableDescriptor
from lake_core.store_fs import StoreFileSystems
from lake_query.planning.versions import Step, StepReader, lance_steps, operation_ids

__all__ = ["MAX_KEPT_STEPS", "TAIL_BYTES", "VersionFiles", "manifest_facts", "transaction_step"]

#: How much of a manifest's end is read: its fields after the fragments are a few hundred bytes.
TAIL_BYTES: Final = 8192
#: Steps a replica keeps across listings (a few hundred bytes each).
MAX_KEPT_STEPS: Final = 100_000
#: Parallel reads of one listing (each a small file, or a ranged read on S3).
READERS: Final = 8

_U64_MAX: Final = 2**64 - 1
_FOOTER: Final = 16
_MAGIC: Final = b"LANC"
_MANIFEST_NAME = re.compile(r"([0-9]{1,20})\.manifest")
_TRANSACTION_NAME = re.compile(r"[0-9]{1,20}-[0-9a-fA-F-]{1,64}\.txn")

# lance.table.Manifest fields.
_VERSION, _TIMESTAMP, _TRANSACTION_FILE = 3, 7, 12
_BEFORE_VERSION: Final = frozenset({1, 2})  # the schema's fields and the fragments
# lance.table.Transaction fields and operations.
_READ_VERSION, _PROPERTIES = 1, 4
_APPEND, _OVERWRITE, _RESTORE = 100, 102, 106
_FIRST_OPERATION: Final = 100
# lance.table.DataFragment.physical_rows
_PHYSICAL_ROWS: Final = 4

_Field = tuple[int, int, int | bytes]


class VersionFiles:
    """Reads walk steps from a table's store (thread-safe; one per replica).

    A Lance version's manifest and transaction never change, so the steps
    read are kept (up to :data:`MAX_KEPT_STEPS`) per table incarnation: a
    listing reads only the versions committed since the last one, and the
    DoGet of a planned listing reads none. Each listing still lists
    ``_versions/``, and a kept step is used only while its version is stored.
    """

    def __init__(self, storage: DatasetStorage) -> None:
        self._stores = StoreFileSystems(storage)
        self._lock = threading.Lock()
        #: Steps read, per table incarnation ``(location, incarnation)``.
        self._kept: dict[tuple[str, str], dict[int, Step]] = {}

    def steps(self, dataset: Any, head: TableDescriptor, *, ahead: bool = True) -> StepReader:
        """Steps for walking back from ``head`` from the files, else through Lance.

        ``ahead``: read every stored version up to the head first (a listing
        walks them all); otherwise each as the walk reaches it (a selector's
        walk takes a few steps).
        """
        through_lance = lance_steps(dataset)
        found = self._read_ahead(head).get if ahead else self._one_by_one(head)

        def read(current: int) -> Step | None:
            step = found(current)
            return step if step is not None else through_lance(current)

        return read

    def _one_by_one(self, head: TableDescriptor) -> Callable[[int], Step | None]:
        fs, root = self._stores.where(head.location)
        with self._lock:
            kept = self._kept.get((head.location, head.incarnation), {})

        def read(version: int) -> Step | None:
            step = kept.get(version)
            if step is not None:
                return step
            names = (f"{_U64_MAX - version:020d}.manifest", f"{version}.manifest")
            paths = (f"{root}/_versions/{name}" for name in names)
            return next((s for path in paths if (s := _step(fs, root, version, path))), None)

        return read

    def _read_ahead(self, head: TableDescriptor) -> dict[int, Step]:
        """The steps of every stored version up to the head that decode with certainty."""
        fs, root = self._stores.where(head.location)
        try:
            listed = fs.get_file_info(pafs.FileSelector(f"{root}/_versions"))
        except OSError:
            return {}  # unreachable or gone: Lance reads (and reports) as before
        stored = {
            version: info
            for info in listed
            if (version := _manifest_version(info.base_name)) is not None
            and version <= head.engine_version
        }
        key = (head.location, head.incarnation)
        with self._lock:
            kept = self._kept.get(key, {})
        ahead = {version: kept[version] for version in stored if version in kept}
        unread = [(version, info) for version, info in stored.items() if version not in kept]
        with ThreadPoolExecutor(READERS, thread_name_prefix="lake-versions") as pool:
            found = pool.map(lambda item: _step(fs, root, item[0], item[1].path), unread)
            ahead.update((v, step) for (v, _), step in zip(unread, found, strict=True) if step)
        self._keep(key, ahead)
        return ahead

    def _keep(self, key: tuple[str, str], steps: dict[int, Step]) -> None:
        with self._lock:
            self._kept.pop(key, None)
            if sum(map(len, self._kept.values())) + len(steps) > MAX_KEPT_STEPS:
                self._kept.clear()  # past the bound, a replica reads its tables afresh
            if len(steps) <= MAX_KEPT_STEPS:
                self._kept[key] = steps


def _manifest_version(name: str) -> int | None:
    """The version a ``_versions/`` file name holds (Lance's V1 or V2 naming), or None."""
    matched = _MANIFEST_NAME.fullmatch(name)
    if matched is None:
        return None
    number = int(matched.group(1))
    if len(matched.group(1)) == 20 and number > _U64_MAX // 2:
        return _U64_MAX - number  # V2: names sort newest first
    return number


def _step(fs: pafs.FileSystem, root: str, version: int, path: str) -> Step | None:
    try:
        with fs.open_input_file(path) as manifest:
            size = manifest.size()
            start = max(0, size - TAIL_BYTES)
            facts = manifest_facts(manifest.read_at(size - start, start), version)
        if facts is None:
            return None
        committed_at, transaction_file = facts
        with fs.open_input_file(f"{root}/_transactions/{transaction_file}") as transaction:
            return transaction_step(transaction.readall(), committed_at)
    except (OSError, ValueError):
        return None  # gone meanwhile, or unreadable: Lance decides


def manifest_facts(tail: bytes, version: int) -> tuple[datetime, str] | None:
    """``(commit time, transaction file)`` from a manifest's end; None unless certain.

    The fields after the fragments start with ``version``'s field. Every place
    in ``tail`` where that field could start is parsed to the end of the
    message; exactly one must parse as those fields (a match inside the last
    fragment would meet the version's field twice).
    """
    if len(tail) < _FOOTER or tail[-len(_MAGIC) :] != _MAGIC:
        return None
    body = tail[:-_FOOTER]
    marker = bytes([_VERSION << 3]) + _varint_bytes(version)
    found = []
    at = body.find(marker)
    while at >= 0:
        facts = _after_fragments(body, at, version)
        if facts is not None:
            found.append(facts)
        at = body.find(marker, at + 1)
    return found[0] if len(found) == 1 else None


def _after_fragments(body: bytes, start: int, version: int) -> tuple[datetime, str] | None:
    try:
        return _facts(list(_fields(body, start)), version)
    except (ValueError, OverflowError, OSError):
        return None  # not where the fields start, or a timestamp no clock holds


def _facts(fields: list[_Field], version: int) -> tuple[datetime, str] | None:
    numbers = [number for number, _, _ in fields]
    if numbers.count(_VERSION) != 1 or _BEFORE_VERSION.intersection(numbers):
        return None
    if numbers.count(_TIMESTAMP) != 1 or numbers.count(_TRANSACTION_FILE) != 1:
        return None
    values = {number: (wire, value) for number, wire, value in fields}
    if values[_VERSION] != (0, version):
        return None
    wire, stamp = values[_TIMESTAMP]
    wire_name, name = values[_TRANSACTION_FILE]
    if wire != 2 or wire_name != 2 or not isinstance(stamp, bytes) or not isinstance(name, bytes):
        return None
    transaction_file = name.decode("ascii", errors="replace")
    if _TRANSACTION_NAME.fullmatch(transaction_file) is None:
        return None
    committed_at = _timestamp(stamp)
    return None if committed_at is None else (committed_at, transaction_file)


def _timestamp(data: bytes) -> datetime | None:
    """A ``google.protobuf.Timestamp`` as pylance reports it.

    pylance (``_convert_version_timestamp``) turns the nanoseconds into a
    datetime through float arithmetic, which rounds some microseconds up; the
    same arithmetic gives the same instant, so a listing reads the same
    ``committed_at`` whichever way a step was read.
    """
    seconds = nanos = 0
    for number, wire, value in _fields(data):
        if wire != 0 or not isinstance(value, int):
            return None
        if number == 1:
            seconds = value
        elif number == 2:
            nanos = value
    if not 0 <= nanos < 1_000_000_000 or seconds >= 2**62:
        return None
    ts_nanos = seconds * 1_000_000_000 + nanos
    return datetime.fromtimestamp(ts_nanos // 1e9, UTC) + timedelta(
        microseconds=(ts_nanos % 1e9) // 1e3
    )


def transaction_step(data: bytes, committed_at: datetime) -> Step | None:
    """The walk's step from a transaction file; None for a create or anything unexpected."""
    read_version, properties, operation = 0, {}, None
    for number, wire, value in _fields(data):
        if number == _READ_VERSION and wire == 0 and isinstance(value, int):
            read_version = value
        elif number == _PROPERTIES and wire == 2 and isinstance(value, bytes):
            key, text = _map_entry(value)
            properties[key] = text
        elif number >= _FIRST_OPERATION and wire == 2 and isinstance(value, bytes):
            if operation is not None:
                return None
            operation = (number, value)
    if operation is None or operation[0] == _OVERWRITE:
        return None  # a create's rows are its manifest's total: Lance reads it
    kind, body = operation
    if kind == _RESTORE:
        target = dict((n, v) for n, _, v in _fields(body)).get(1, 0)
        return Step(committed_at, "restore", 0, (), target) if isinstance(target, int) else None
    if kind == _APPEND:
        added = sum(_physical_rows(f) for n, _, f in _fields(body) if n == 1)
        return Step(committed_at, "append", added, operation_ids(properties), read_version)
    return Step(committed_at, "maintenance", 0, (), read_version)


def _physical_rows(fragment: int | bytes) -> int:
    if not isinstance(fragment, bytes):
        raise ValueError("a fragment is a message")
    rows = [v for n, w, v in _fields(fragment) if n == _PHYSICAL_ROWS and w == 0]
    return int(rows[-1]) if rows else 0


def _map_entry(data: bytes) -> tuple[str, str]:
    entry = {n: v for n, w, v in _fields(data) if w == 2}
    key, value = entry.get(1, b""), entry.get(2, b"")
    if not isinstance(key, bytes) or not isinstance(value, bytes):
        raise ValueError("a map entry holds strings")
    return key.decode(), value.decode()


def _fields(data: bytes, start: int = 0) -> Iterator[_Field]:
    """``(number, wire type, value)`` of each protobuf field; ValueError unless it ends exactly."""
    at, end = start, len(data)
    while at < end:
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            value, at = _varint(data, at)
            yield number, wire, value
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > end:
                raise ValueError("a field runs past the message")
            yield number, wire, data[at : at + length]
            at += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > end:
                raise ValueError("a field runs past the message")
            yield number, wire, int.from_bytes(data[at : at + width], "little")
            at += width
        else:
            raise ValueError(f"wire type {wire}")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    try:
        byte = data[at]
        if byte < 0x80:
            return byte, at + 1  # most are one byte
        value, shift = byte & 0x7F, 7
        while shift < 64:
            at += 1
            byte = data[at]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, at + 1
            shift += 7
    except IndexError:
        raise ValueError("a varint runs past the message") from None
    raise ValueError("a varint longer than 64 bits")


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
