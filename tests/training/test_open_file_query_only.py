"""open_file on a query-only client: reads through Query-issued capabilities, renewed in time."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import lake_sdk
from lake_sdk._files import CapabilityRanges
from tests.files.conftest import MIB, write_random
from tests.training.open_file_support import (
    Stage,
    random_access,
    store_file,
)

pytestmark = pytest.mark.s3

SIZE = 5 * MIB + 777


def _status(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def stored(s3_stage: Stage, tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    path = write_random(tmp_path / "object.bin", SIZE, seed=11)
    with lake_sdk.Client(s3_stage.url) as writer:
        location = store_file(writer, path, request.node.name)
    with lake_sdk.Client(s3_stage.url, query_only=True) as client:
        yield client, location, path.read_bytes()


def test_query_only_random_reads_and_a_verified_sequential_read(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data = stored
    with client.open_file(location, block_size=256 * 1024, cache_bytes=2 * MIB) as file:
        random_access(file, data, 300, seed=5)
        assert file.peak_cached_bytes <= 2 * MIB
    with client.open_file(location) as file:
        assert file.read() == data
        assert file.verified
        ranges = file._fetcher
        assert isinstance(ranges, CapabilityRanges)
        assert ranges.issued == 1  # one capability served every range of this file


def test_capabilities_are_renewed_across_a_short_ttl(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data = stored
    with client.open_file(location, block_size=256 * 1024, ttl=2) as file:
        ranges = file._fetcher
        assert isinstance(ranges, CapabilityRanges)
        assert file.read(1000) == data[:1000]
        first = ranges._capability
        assert first is not None
        assert ranges.issued == 1
        # Inside the last quarter of its life a capability is replaced before it is used.
        renew_at = first.expires_at - timedelta(seconds=0.5)
        while datetime.now(UTC) < renew_at:  # wait for the event itself: the clock
            time.sleep(0.02)
        file.seek(2 * MIB)
        assert file.read(1000) == data[2 * MIB : 2 * MIB + 1000]
        second = ranges._capability
        assert ranges.issued == 2
        assert second is not None
        assert second.expires_at > first.expires_at
        while datetime.now(UTC) <= second.expires_at:
            time.sleep(0.05)
        # Storage refuses an expired capability, so reading on must have renewed again.
        assert _status(second.url, {**second.headers, "Range": "bytes=0-9"}) == 403
        file.seek(4 * MIB)
        assert file.read(MIB) == data[4 * MIB : 5 * MIB]
        assert ranges.issued == 3
        file.seek(0)
        assert file.read() == data
        assert file.verified
