"""The background log writer: records written in order, off the caller's thread, in its context."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest
import structlog

from lake_core.logs import configure_logging
from lake_core.logwriter import BackgroundHandler


class Recording(logging.Handler):
    """Keeps each record's message and the thread that wrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def emit(self, record: logging.LogRecord) -> None:
        self.gate.wait(10)
        self.lines.append((record.getMessage(), threading.current_thread().name))


def test_records_are_written_in_order_by_the_writer_thread() -> None:
    target = Recording()
    handler = BackgroundHandler(target)
    logger = logging.getLogger("lake.test.logwriter")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        target.gate.clear()  # the writer blocks: the callers must not
        for n in range(50):
            logger.warning("line %d", n)
        assert target.lines == []
        target.gate.set()
        handler.flush()  # returns once everything queued before it was written
        assert [line for line, _ in target.lines] == [f"line {n}" for n in range(50)]
        assert {thread for _, thread in target.lines} == {"lake-log-writer"}
    finally:
        logger.removeHandler(handler)
        handler.close()
    # After close (interpreter exit) records are written by the caller.
    handler.handle(logging.makeLogRecord({"msg": "late"}))
    assert target.lines[-1] == ("late", threading.current_thread().name)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    configure_logging(env={}, background=True)
    try:
        yield stream
    finally:
        for handler in root.handlers:
            if isinstance(handler, BackgroundHandler):
                handler.close()
        root.handlers[:], root.level = saved
        structlog.reset_defaults()


def test_configured_records_keep_the_callers_context(captured: io.StringIO) -> None:
    # (pytest adds its own capturing handlers beside the configured one.)
    (handler,) = [h for h in logging.getLogger().handlers if isinstance(h, BackgroundHandler)]
    structlog.contextvars.bind_contextvars(request_id="00aa11bb22cc33dd")
    try:
        structlog.get_logger("lake.test").info("from structlog", rows=3)
        # A stdlib logger's record is rendered on the writer thread, with the
        # context variables of the thread that logged it.
        logging.getLogger("lake.test.stdlib").info("from stdlib")
    finally:
        structlog.contextvars.unbind_contextvars("request_id")
    handler.flush()
    records = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["from structlog", "from stdlib"]
    assert all(r["request_id"] == "00aa11bb22cc33dd" for r in records)
    assert records[0]["rows"] == 3
