"""A Metasrv address whose port is out of range is refused, not dialled modulo 65536."""

from __future__ import annotations

import pytest

from lake_core.errors import InvalidArgument
from lake_core.metaclient import MetaClient


@pytest.mark.parametrize(
    "addr", ["127.0.0.1:99999", "http://127.0.0.1:65536", "grpc://localhost:0"]
)
def test_an_out_of_range_port_is_invalid_argument(addr: str) -> None:
    # gRPC would dial 127.0.0.1:34463 for 99999: a server nobody named.
    with pytest.raises(InvalidArgument, match=r"is not in 1\.\.65535"):
        MetaClient(addr)


@pytest.mark.asyncio
@pytest.mark.parametrize("addr", ["127.0.0.1:50052", "http://[::1]:65535", "https://h:1"])
async def test_a_port_in_range_builds_a_client(addr: str) -> None:
    client = MetaClient(addr)  # builds a channel, sends nothing
    await client.close()
