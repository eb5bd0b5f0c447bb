"""The registrar service: every shipped segment registered in its Iceberg table once.

For each ``Uploaded`` entry of its pipeline, in recording order, the
registrar reads the segment's footer, brings the table's schema up to it
(one commit, schema first), then fast-appends the file with its object key
in the snapshot summary (a second commit). The set of registered keys comes
from the table itself, rebuilt at startup and after every failed commit, so
restarts, lost responses and competing writers converge on one data file per
segment. Before a segment is registered its bytes are checked against the
size and SHA-256 the shipper recorded: one that differs is refused
(:class:`SegmentCorrupted`, logged and counted) and the pass goes on with the
others; it stays unregistered and is checked again on the next pass. Other
fatal errors (:attr:`RegistrarError.fatal`) stop the service; transient ones
wait out the configured backoff and try again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from lake_core.telemetry import series
from lake_iceberg.errors import IcebergSchemaMismatch, RegistrarError, SegmentCorrupted
from lake_iceberg.registrar.append import append_segment, build_data_file, committed_keys
from lake_iceberg.registrar.config import RegistrarConfig
from lake_iceberg.registrar.digest import verify_digest
from lake_iceberg.registrar.failures import CommitOutcome, classify, commit_outcome
from lake_iceberg.registrar.footer import read_footer
from lake_iceberg.registrar.schema_merge import file_schema, merge_schema
from lake_iceberg.registrar.segments import SegmentCatalog, Uploaded
from lake_iceberg.registrar.ship import s3_client
from lake_iceberg.registrar.tables import Tables, open_catalog

__all__ = ["Progress", "Registrar"]

log = structlog.get_logger("lake.iceberg.registrar")

#: Conflicts in a row retried at once before the backoff applies.
_FREE_CONFLICTS = 5


@dataclass
class Progress:
    registered: int = 0
    skipped: int = 0
    pending: int = 0
    #: Segments whose object is not the bytes the shipper recorded (left unregistered).
    refused: int = 0


class _Dataset:
    """One table's state: the loaded table and the keys it has registered."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.table: Table | None = None
        self.keys: set[str] = set()


class Registrar:
    """Registers a segment catalog's entries in Iceberg tables.

    ``catalog`` (a pyiceberg Catalog) and ``s3`` (a boto3 S3 client) are
    seams: by default both are built from ``config``.
    """

    def __init__(
        self,
        config: RegistrarConfig,
        *,
        catalog: Catalog | None = None,
        s3: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self._catalog = catalog
        self._s3 = s3
        self._sleep = sleep
        self._datasets: dict[str, _Dataset] = {}
        #: Refused segments: (bucket, key) -> (recorded size, SHA-256, ETag of the object read).
        self._refused: dict[tuple[str, str], tuple[int, str, str]] = {}

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            store = self.config.store
            self._s3 = s3_client(
                store.endpoint,
                store.region,
                store.access_key_id.reveal() if store.access_key_id else None,
                store.secret_access_key.reveal() if store.secret_access_key else None,
            )
        return self._s3

    def _retrying(self, what: str, action: Callable[[], Any]) -> Any:
        """Run ``action``; fatal errors raise, transient ones back off and retry."""
        attempt = 0
        while True:
            try:
                return action()
            except Exception as exc:
                error = classify(exc)
                if error.fatal:
                    raise error from exc
                self._backoff(what, error, attempt)
                attempt += 1

    def _backoff(self, what: str, error: RegistrarError, attempt: int) -> None:
        delay = self.config.retry.delay(attempt, random.random())
        log.warning(
            "registrar.retry",
            step=what,
            code=error.reason,
            error=str(error),
            delay_s=round(delay, 3),
        )
        self._sleep(delay)

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self._retrying("catalog", lambda: open_catalog(self.config))
        return self._catalog

    def pending_entries(self) -> list[Uploaded]:
        """This pipeline's entries under the configured url, in recording order."""
        with SegmentCatalog(self.config.segments_dir, create=False) as segments:
            entries = segments.entries(self.config.pipeline)
        return [
            e
            for e in entries
            if e.bucket == self.config.bucket
            and e.object_key.startswith(self.config.dataset_prefix(e.dataset) + "/")
        ]

    def run_once(self) -> Progress:
        """Register every entry not yet in its table; returns what happened."""
        try:
            progress = self._run_once()
        except BaseException:
            series.REGISTRAR_PASSES.inc(outcome="failed")
            raise
        series.REGISTRAR_PASSES.inc(outcome="ok")
        return progress

    def _run_once(self) -> Progress:
        entries = self.pending_entries()
        progress = Progress(pending=len(entries))
        tables = Tables(self.config, self.catalog())
        for entry in entries:
            state = self._datasets.setdefault(entry.dataset, _Dataset(entry.dataset))
            if state.table is None:
                self._reload(tables, state, None)
            outcome = self._outcome(tables, state, entry)
            setattr(progress, outcome, getattr(progress, outcome) + 1)
            series.REGISTRAR_SEGMENTS.inc(outcome=outcome)
            progress.pending -= 1
            log.info(
                "registrar.progress",
                dataset=entry.dataset,
                key=entry.object_key,
                registered=progress.registered,
                skipped=progress.skipped,
                pending=progress.pending,
                refused=progress.refused,
            )
        return progress

    def _outcome(self, tables: Tables, state: _Dataset, entry: Uploaded) -> str:
        """What became of one entry: ``registered``, ``skipped`` or ``refused``."""
        if entry.object_key in state.keys:
            return "skipped"
        if self._refused_unchanged(entry):
            return "refused"
        try:
            return "registered" if self._register(tables, state, entry) else "skipped"
        except SegmentCorrupted as error:
            # One damaged object must not hold back the segments after it.
            log.error(
                "registrar.refused",
                dataset=entry.dataset,
                key=entry.object_key,
                code=error.reason,
                error=str(error),
            )
            if error.etag:
                self._refused[(entry.bucket, entry.object_key)] = (
                    entry.size,
                    entry.sha256,
                    error.etag,
                )
            return "refused"

    def _refused_unchanged(self, entry: Uploaded) -> bool:
        """Whether ``entry`` was refused and neither its record nor its object changed since.

        A refused segment stays pending, so every pass meets it again. Reading
        and hashing its whole object each time (every few seconds, for as long
        as nobody re-ships it) would cost its size in bandwidth per pass: one
        HEAD tells whether the object is still the one refused. A re-shipped
        object (a new ETag) or a new record (size or SHA-256) is checked anew.
        """
        refused = self._refused.get((entry.bucket, entry.object_key))
        if refused is None:
            return False
        size, sha256, etag = refused
        if (entry.size, entry.sha256) != (size, sha256):
            del self._refused[(entry.bucket, entry.object_key)]
            return False
        try:
            head = self.s3.head_object(Bucket=entry.bucket, Key=entry.object_key)
        except Exception:
            # Gone, the store refusing, a transient fault: the full check handles (and
            # retries or reports) each as it did the first time.
            del self._refused[(entry.bucket, entry.object_key)]
            return False
        if head.get("ETag") != etag:
            del self._refused[(entry.bucket, entry.object_key)]
            return False
        log.debug("registrar.still_refused", dataset=entry.dataset, key=entry.object_key)
        return True

    def run(self, poll_interval: float = 5.0, stop: threading.Event | None = None) -> None:
        """Register new entries until ``stop`` is set; a fatal error ends it."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.run_once()
            except RegistrarError as error:
                log.error("registrar.fatal", code=error.reason, error=str(error))
                raise
            stop.wait(poll_interval)

    def _reload(self, tables: Tables, state: _Dataset, schema: Schema | None) -> None:
        """Load (or create) the table and rebuild its committed keys from the table itself."""
        if schema is None:
            state.table = self._retrying("load", lambda: tables.load(state.name))
        else:
            state.table = self._retrying("open", lambda: tables.open(state.name, schema))
        state.keys = set() if state.table is None else self._registered(state.table)

    def _registered(self, table: Table) -> set[str]:
        """Keys from snapshot summaries, plus keys of files the current snapshot references.

        The second half keeps registrations visible should snapshots (and
        their summaries) ever be expired by table maintenance.
        """
        keys = committed_keys(table)
        if table.current_snapshot() is None:
            return keys
        bucket_prefix = f"s3://{self.config.bucket}/"
        for task in self._retrying("scan", lambda: list(table.scan().plan_files())):
            path = task.file.file_path
            if path.startswith(bucket_prefix):
                keys.add(path[len(bucket_prefix) :])
        return keys

    def _register(self, tables: Tables, state: _Dataset, entry: Uploaded) -> bool:
        """Register one segment; False when it turned out to be registered already."""
        self._retrying("verify", lambda: verify_digest(self.s3, entry))
        footer = self._retrying("footer", lambda: read_footer(self.s3, entry))
        segment = file_schema(footer.schema.to_arrow_schema(), entry.dataset)
        failures = 0
        while True:
            if state.table is None:
                self._reload(tables, state, segment)
            table = state.table
            assert table is not None
            if entry.object_key in state.keys:
                log.info("registrar.skipped", dataset=entry.dataset, key=entry.object_key)
                return False
            try:
                table = state.table = tables.finish_create(table, segment)
                merged = merge_schema(
                    table.schema(),
                    segment,
                    next_schema_id=max(s.schema_id for s in table.metadata.schemas) + 1,
                )
                if merged.violations:
                    raise IcebergSchemaMismatch(
                        tables.name(entry.dataset), entry.object_key, merged.violations
                    )
                if merged.changed:
                    table = tables.commit_schema(table, merged.schema)
                    state.table = table
                data_file = build_data_file(table, entry, footer, segment)
                state.table = append_segment(table, entry, data_file)
            except Exception as exc:
                outcome = commit_outcome(exc)
                error = classify(exc)
                if error.fatal:
                    raise error from exc
                # Reload before deciding again: the table moved, or the commit
                # may have landed with its response lost.
                state.table = None
                if outcome is CommitOutcome.CONFLICT and failures < _FREE_CONFLICTS:
                    log.info("registrar.conflict", dataset=entry.dataset, key=entry.object_key)
                else:
                    self._backoff("commit", error, failures)
                failures += 1
                continue
            state.keys.add(entry.object_key)
            log.info(
                "registrar.registered",
                dataset=entry.dataset,
                key=entry.object_key,
                rows=footer.num_rows,
            )
            return True
