"""What tests read of a Query replica's native data plane (``LAKE_QUERY_DATA_ADDR``)."""

from __future__ import annotations

import json

from tools.lake_testing.servers import LakeProcess

__all__ = ["NEVER_READING", "GrpcOptions", "data_plane_streams"]

#: gRPC channel arguments, as pyarrow's ``generic_options`` takes them.
GrpcOptions = list[tuple[str, str | int]]
#: Channels of clients that stop reading to hold a stream (and its permit or a
#: drain) open. gRPC's BDP probe grows a channel's receive window to the
#: bandwidth-delay product it measures, which late ping answers on a loaded
#: machine inflate: the window then took a whole ~20 MB result in, unread, the
#: server rightly finished the stream (no message waited). The default 64 KiB
#: window keeps such a result blocked in a server write.
NEVER_READING: GrpcOptions = [("grpc.http2.bdp_probe", 0)]


def data_plane_streams(process: LakeProcess) -> int:
    """How many DoGet streams ``process``'s data plane has ended (its own log says)."""
    count = 0
    for line in process.log().splitlines():
        marked = line.startswith("{") and '"data plane stream ended"' in line
        if marked and json.loads(line).get("event") == "data plane stream ended":
            count += 1
    return count
