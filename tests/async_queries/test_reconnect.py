"""The SDK's job channel after its Query replica restarts, on real processes.

gRPC shares connections between channels of one target and options across a
process. A job client made after the replica came back used to inherit an
older client's failed connection, still in reconnect backoff, and fail fast
("Connection refused") although the new process was serving: the fault the
Metasrv client had (``packages/lake-metasrv/tests/test_crash.py``,
``test_a_new_client_reaches_a_restarted_metasrv_at_once``). The job channel
keeps its own connections (``grpc.use_local_subchannel_pool``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from lake_core.errors import LakeError
from tests.async_queries.conftest import SQL, AsyncLake, client

#: Long enough for the old client's reconnect backoff to grow past a second:
#: a new client sharing its connection would fail for that long.
OUTAGE_S = 3.0


def test_a_new_job_client_reaches_a_restarted_replica_at_once(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    replica = async_lake.add_query()
    loaded(10)
    with client(replica) as old:
        old.jobs.submit(SQL)  # its job channel is connected
        for _ in range(2):
            replica.kill()
            restarted = threading.Event()

            def retry_until(restarted: threading.Event = restarted) -> None:
                # An old client submitting through the outage, its backoff growing.
                while not restarted.is_set():
                    with contextlib.suppress(LakeError):
                        old.jobs.submit(SQL)
                    time.sleep(0.05)

            retrying = threading.Thread(target=retry_until, daemon=True)
            retrying.start()
            try:
                time.sleep(OUTAGE_S)
                replica.start()
                with client(replica) as new:
                    # Its submission retries for about a second in all: a shared
                    # connection in backoff fails it.
                    handle = new.jobs.submit(SQL)
                    assert new.jobs.resume(handle).to_table().num_rows == 10
            finally:
                restarted.set()
                retrying.join(timeout=120)
            assert not retrying.is_alive()
