"""What tests read of a Query replica's native data plane (``LAKE_QUERY_DATA_ADDR``)."""

from __future__ import annotations

import json

from tools.lake_testing.servers import LakeProcess

__all__ = ["data_plane_streams"]


def data_plane_streams(process: LakeProcess) -> int:
    """How many DoGet streams ``process``'s data plane has ended (its own log says)."""
    count = 0
    for line in process.log().splitlines():
        marked = line.startswith("{") and '"data plane stream ended"' in line
        if marked and json.loads(line).get("event") == "data plane stream ended":
            count += 1
    return count
