"""lake_core.startup: one start-up sequence for every server, and its fault-point warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lake_core.config import FAULTS, LOG_FORMAT

# A process that starts like a server: its config is a string, serving prints it.
_PROCESS = """
import sys
from lake_core.startup import run_process

def load():
    print("loaded", file=sys.stderr, flush=True)
    return "the-config"

async def serve(config):
    print("serving " + config, file=sys.stderr, flush=True)
    if sys.argv[1] == "fail":
        raise OSError("could not bind")
    return int(sys.argv[1])

sys.exit(run_process("lake-test", load=load, serve=serve))
"""


def _start(argument: str, faults: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != FAULTS}
    env[LOG_FORMAT] = "json"
    if faults is not None:
        env[FAULTS] = faults
    return subprocess.run(
        [sys.executable, "-c", _PROCESS, argument],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _records(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def _fault_warnings(stderr: str) -> list[dict[str, object]]:
    return [r for r in _records(stderr) if r.get("variable") == FAULTS]


def test_armed_fault_points_are_named_in_a_warning_before_serving() -> None:
    done = _start("3", "meta.before_lance_commit,query.plan_delay_ms=5")
    assert done.returncode == 3, done.stderr
    [warning] = _fault_warnings(done.stderr)
    assert warning["level"] == "warning"
    assert warning["points"] == ["meta.before_lance_commit"]
    assert warning["settings"] == {"query.plan_delay_ms": 5}
    events = [r["event"] for r in _records(done.stderr)]
    assert (
        events.index("loaded") < events.index(warning["event"]) < events.index("serving the-config")
    )


def test_nothing_armed_no_warning() -> None:
    done = _start("0", None)
    assert done.returncode == 0, done.stderr
    assert "serving the-config" in done.stderr
    assert _fault_warnings(done.stderr) == []
    assert "fault" not in done.stderr


def test_a_bad_fault_spec_fails_before_serving() -> None:
    done = _start("0", "meta.no_such_point")
    assert done.returncode == 1
    assert "LAKE_FAULTS" in done.stderr
    assert "meta.no_such_point" in done.stderr
    assert "serving" not in done.stderr


def test_errors_reach_the_command_unchanged() -> None:
    done = _start("fail", None)
    assert done.returncode == 1
    assert "OSError: could not bind" in done.stderr
