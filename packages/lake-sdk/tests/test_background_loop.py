"""The blocking client's one background loop, and Ctrl-C cancelling what a call started."""

from __future__ import annotations

import asyncio
import threading

import pyarrow as pa
import pytest

import lake_sdk
from lake_core import protocol
from lake_sdk._background_loop import BackgroundLoop
from tools.lake_testing.interrupts import ctrl_c_when

#: Generous bounds for facts that take milliseconds; the tests wait on the facts.
WITHIN_S = 30.0


class SlowTransport(lake_sdk.MockTransport):
    """A Query whose table listing hangs until cancelled (while ``slow``)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = True
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def action(self, name: str, body: bytes) -> bytes:
        if self.slow and name == protocol.LIST_TABLES:
            self.started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return await super().action(name, body)


def test_every_blocking_client_shares_one_loop_thread() -> None:
    first = lake_sdk.Client("mock://", transport=lake_sdk.MockTransport())
    second = lake_sdk.Client("grpc://127.0.0.1:1")
    with first:
        pass  # closing a client leaves the shared loop running for the others
    assert first._runner is second._runner is BackgroundLoop.shared()
    loops = [t for t in threading.enumerate() if t.name == "lake-sdk-loop"]
    assert len(loops) == 1
    assert loops[0].daemon
    with lake_sdk.Client("mock://", transport=lake_sdk.MockTransport()) as third:
        assert third.list_tables() == []


def test_ctrl_c_cancels_the_blocking_call_and_the_client_still_works(
    sigint_raises_keyboard_interrupt: None,
) -> None:
    assert threading.current_thread() is threading.main_thread()
    transport = SlowTransport()
    transport.add_table("robots.runs", pa.table({"id": pa.array([1], pa.int64())}))
    with lake_sdk.Client("mock://", transport=transport) as client:
        presser = ctrl_c_when(transport.started.is_set, WITHIN_S)
        with pytest.raises(KeyboardInterrupt):
            client.list_tables()
        assert presser.join(WITHIN_S)
        # The call returned only after the coroutine it started was cancelled.
        assert transport.cancelled.is_set()
        transport.slow = False
        assert [str(t.table) for t in client.list_tables()] == ["robots.runs"]
        assert client.query_table("SELECT * FROM robots.runs").num_rows == 1


def test_a_blocking_call_on_the_loop_thread_is_refused() -> None:
    loop = BackgroundLoop.shared()

    async def nested() -> None:
        loop.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own event loop thread"):
        loop.run(nested())


def test_errors_and_results_cross_the_thread_unchanged() -> None:
    loop = BackgroundLoop.shared()

    async def fails() -> None:
        raise lake_sdk.TableNotFound("robots.nope")

    async def answers() -> int:
        return 42

    with pytest.raises(lake_sdk.TableNotFound, match=r"robots\.nope"):
        loop.run(fails())
    assert loop.run(answers()) == 42
