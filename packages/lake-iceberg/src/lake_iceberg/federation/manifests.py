"""A manifest's live entries, read as pyiceberg reads them but with a reused reader tree.

pyiceberg's ``ManifestFile.fetch_manifest_entry`` converts the Avro schema
each manifest embeds into an Iceberg schema and resolves a reader tree for
it on every file. For small manifests that is most of the work: the 40
one-file manifests of the ``iceberg_scan`` bench table cost 0.133 s of CPU
to read that way and 0.072 s with the tree reused (median of 10, same
process, alternating). Every manifest written with one partition spec
embeds the same schema text, so :class:`_ReusedReaderFile` keeps a bounded
map from that text to its (schema, reader tree). The readers hold no state
between reads (pyiceberg's reader classes set their attributes only when
built), so one tree serves every planning thread.

Everything else is pyiceberg's own: the read schema, record types, enums
and sequence-number inheritance of ``fetch_manifest_entry``. The streamed
plan that uses this (lake_iceberg.federation.scan) is compared with
pyiceberg's ``plan_files`` by tests/iceberg/test_federation_streamed_plan.py.

Given a :class:`~lake_iceberg.federation.contents.ManifestBytes`, a manifest
already read under the same path and recorded length is decoded from the
bytes kept there instead of being fetched again (a manifest never changes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import AvroFile
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    _inherit_from_manifest,
)
from pyiceberg.schema import Schema

from lake_iceberg.federation.contents import ManifestBytes

__all__ = ["READER_TREES", "live_entries"]

#: Distinct manifest schemas (one per table and partition spec) whose reader trees are kept.
READER_TREES = 256
_SCHEMA_KEY = "avro.schema"
_READ_SCHEMA = MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION]
_READ_TYPES = {-1: ManifestEntry, 2: DataFile}
_READ_ENUMS = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}

_trees: OrderedDict[str, tuple[Schema, Reader]] = OrderedDict()
_lock = threading.Lock()


class _ReusedReaderFile(AvroFile[ManifestEntry]):
    """pyiceberg's AvroFile, resolving each distinct embedded schema once.

    ``content``: the file's bytes, when already at hand (not fetched again).
    """

    content: bytes | None = None

    def __enter__(self) -> _ReusedReaderFile:
        if self.content is None:
            with self.input_file.open() as stream:
                self.content = stream.read()
        self.decoder = new_decoder(self.content)
        self.header = self._read_header()
        text = self.header.meta.get(_SCHEMA_KEY)
        tree = None if text is None else _recall(text)
        if tree is None:
            schema = self.header.get_schema()
            tree = (schema, resolve_reader(schema, _READ_SCHEMA, _READ_TYPES, _READ_ENUMS))
            if text is not None:
                _remember(text, tree)
        self.schema, self.reader = tree
        self.read_schema = _READ_SCHEMA
        return self


def live_entries(
    io: FileIO, manifest: ManifestFile, contents: ManifestBytes | None = None
) -> list[ManifestEntry]:
    """``manifest.fetch_manifest_entry(io, discard_deleted=True)``, with a reused reader tree.

    ``contents``: manifest bytes kept by this replica, consulted and filled.
    """
    path, length = manifest.manifest_path, manifest.manifest_length
    file = _ReusedReaderFile(io.new_input(path), _READ_SCHEMA, _READ_TYPES, _READ_ENUMS)
    if contents is not None:
        file.content = contents.get(path, length)
    with file as reader:
        entries = [
            _inherit_from_manifest(entry, manifest)
            for entry in reader
            if entry.status != ManifestEntryStatus.DELETED
        ]
    if contents is not None and file.content is not None:
        contents.put(path, length, file.content)  # only once it decoded whole
    return entries


def _recall(text: str) -> tuple[Schema, Reader] | None:
    with _lock:
        tree = _trees.get(text)
        if tree is not None:
            _trees.move_to_end(text)
        return tree


def _remember(text: str, tree: tuple[Schema, Reader]) -> None:
    with _lock:
        _trees[text] = tree
        while len(_trees) > READER_TREES:
            _trees.popitem(last=False)
