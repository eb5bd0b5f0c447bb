"""A local Ray for tests: two CPUs, no usage stats, no auth token, its own temp dir.

FINDINGS ("Ray Data"): ``RAY_USAGE_STATS_ENABLED=0`` keeps Ray off the
network, ``RAY_AUTH_MODE=disabled`` stops it writing a token under the home
directory, and ``_temp_dir`` keeps its sockets and logs in a directory of the
test's own (short: Ray's Unix socket paths must fit in 107 bytes). Stopping
it waits until no process that names that directory is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def _wait_gone(temp: Path, *, stop_stragglers: bool = False) -> None:
    """Wait until no process names ``temp``; after a failed start, stop them by pid."""
    deadline = time.monotonic() + 60
    while (left := processes_naming(str(temp))) and time.monotonic() < deadline:
        if stop_stragglers and time.monotonic() > deadline - 50:
            for pid in left:  # only processes of this Ray: they name its own temp dir
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    assert not left, f"Ray left processes behind: {left}"


@contextmanager
def local_ray(num_cpus: int = 2, *, worker_niceness: int | None = None) -> Iterator[Path]:
    """``ray.init`` on this machine only; yields its temp dir; shuts down and checks it is gone.

    ``worker_niceness``: the nice value of Ray's worker processes (Ray's
    ``RAY_worker_niceness``; Ray's own default is 15). Tests give 0: their
    read tasks share two cores with pytest and Lake's servers, all at nice
    0, and at 15 a busy neighbour starves them (with two busy processes
    beside it a 400,000-row read took 0.9 s instead of 0.14 s, the scan of
    the same rows in the driver 0.04 s either way).
    """
    import ray

    temp = Path(tempfile.mkdtemp(prefix="lray", dir="/tmp"))
    env = dict(_ENV)
    if worker_niceness is not None:
        env["RAY_worker_niceness"] = str(worker_niceness)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # Ray waits a fixed 30 s for its raylet to register; on two busy cores
        # that can run out, so a failed start is shut down and tried again.
        for attempt in range(3):
            try:
                ray.init(
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    _temp_dir=str(temp),
                    runtime_env={"env_vars": dict(_ENV)},
                )
                break
            except Exception:
                ray.shutdown()
                _wait_gone(temp, stop_stragglers=True)
                if attempt == 2:
                    raise
        try:
            yield temp
        finally:
            ray.shutdown()
        _wait_gone(temp)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(temp, ignore_errors=True)
