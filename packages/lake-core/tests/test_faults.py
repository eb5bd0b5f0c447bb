"""lake_core.faults: one variable, named points, inert when unset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lake_core import faults
from lake_core.errors import ConfigError
from lake_core.faults import Faults


def test_unset_arms_nothing_and_every_hook_is_a_no_op() -> None:
    idle = Faults.from_env({})
    assert not idle.armed
    for point in faults.CRASH_POINTS:
        idle.crash(point)  # returns: this process is still here
    for point in faults.STOP_POINTS:
        idle.stop(point)
    assert all(idle.setting(name) is None for name in faults.SETTINGS)
    assert Faults.parse(" , ") == idle


def test_grammar_points_and_settings() -> None:
    armed = Faults.parse(
        "meta.before_lance_commit, meta.lease_ttl_ms=2000,objects.upload_part_size=5242880"
    )
    assert armed.points == {faults.BEFORE_LANCE_COMMIT}
    assert armed.setting(faults.LEASE_TTL_MS) == 2000
    assert armed.setting(faults.UPLOAD_PART_SIZE) == 5 * 1024 * 1024


@pytest.mark.parametrize(
    "spec",
    [
        "meta.before_lance_comit",  # a typo must not silently test nothing
        "before_lance_commit",
        "meta.lease_ttl_ms",  # a setting needs a value
        "meta.lease_ttl_ms=100",
        "meta.lease_ttl_ms=two",
        "objects.upload_part_size=1048576",
        "meta.before_lance_commit=1",
    ],
)
def test_bad_values_name_the_variable(spec: str) -> None:
    with pytest.raises(ConfigError, match="LAKE_FAULTS"):
        Faults.parse(spec)


def test_configure_reads_the_one_variable_once() -> None:
    try:
        assert faults.configure({"LAKE_FAULTS": "meta.lease_ttl_ms=1500"}).armed
        assert faults.setting(faults.LEASE_TTL_MS) == 1500
        assert faults.active() is faults.active()
    finally:
        faults.configure({})
    assert faults.setting(faults.LEASE_TTL_MS) is None


CHILD = """
import threading, time
from lake_core import faults
faults.crash(faults.AFTER_LANCE_COMMIT)   # not armed: a no-op
print("alive", flush=True)
worker = threading.Thread(target=faults.crash, args=(faults.BEFORE_LANCE_COMMIT,))
worker.start()
worker.join()
time.sleep(30)
"""


def test_a_crash_point_exits_137_from_any_thread() -> None:
    env = {**os.environ, "LAKE_FAULTS": faults.BEFORE_LANCE_COMMIT}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == faults.CRASH_EXIT_CODE
    assert done.stdout == b"alive\n"
    assert b"meta.before_lance_commit" in done.stderr


STOPPER = """
from lake_core import faults
faults.stop(faults.STOP_BEFORE_HEAD_UPDATE)
print("resumed", flush=True)
faults.stop(faults.STOP_BEFORE_HEAD_UPDATE)  # only the first time
print("again", flush=True)
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_stop_point_stops_the_process_once() -> None:
    env = {**os.environ, "LAKE_FAULTS": faults.STOP_BEFORE_HEAD_UPDATE}
    child = subprocess.Popen(
        [sys.executable, "-c", STOPPER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while _state(child.pid) != "T":
            assert child.poll() is None, child.stderr.read() if child.stderr else b""
            assert time.monotonic() < deadline, "the child never stopped itself"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
        assert out == b"resumed\nagain\n"
        assert child.returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
