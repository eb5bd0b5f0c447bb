"""A saved job handle is read back exactly, and anything else is refused before any call."""

from __future__ import annotations

import json
import time

import pytest

from lake_core.errors import InvalidArgument
from lake_sdk._jobs import JobHandle


def test_a_saved_handle_reads_back() -> None:
    handle = JobHandle(capability=b"\x01" * 40, expires_at=time.time() + 60)
    again = JobHandle.from_json(handle.to_json())
    assert (again.capability, again.expires_at, again.expired) == (
        handle.capability,
        handle.expires_at,
        False,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"v": True},  # True == 1 in Python: it was accepted as version 1
        {"v": 1.0},
        {"v": 2},
        {"expires_at": "nan"},  # a NaN expiry never expired
        {"expires_at": "inf"},
        {"expires_at": "soon"},
        {"capability": "not base64!"},
        {"capability": ""},
    ],
)
def test_a_malformed_handle_is_refused(change: dict[str, object]) -> None:
    doc = json.loads(JobHandle(capability=b"\x01" * 40, expires_at=time.time() + 60).to_json())
    with pytest.raises(InvalidArgument):
        JobHandle.from_json(json.dumps({**doc, **change}))
