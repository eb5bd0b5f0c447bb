"""What ``lake console`` is configured with: Query's endpoint, TLS, limits."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_ADDR",
    "DEFAULT_PAGE_ROWS",
    "DEFAULT_QUERY_URL",
    "MAX_CLIENTS",
    "RANGE_CHUNK_BYTES",
    "ConsoleSettings",
]

DEFAULT_ADDR = "127.0.0.1:8080"
DEFAULT_QUERY_URL = "grpc://127.0.0.1:50051"
#: Rows on one page of the result grid.
DEFAULT_PAGE_ROWS = 50
#: At most this many bytes of a FILE in one HTTP response (a Range request asking
#: for more, or an open-ended one, gets this much; browsers ask again for the rest).
RANGE_CHUNK_BYTES = 4 * 1024 * 1024
#: Signed-in principals whose SDK clients stay open (least recently used closed first).
MAX_CLIENTS = 64


@dataclass(frozen=True)
class ConsoleSettings:
    """One console process's settings; ``secret`` signs CSRF tokens (random per process)."""

    query_url: str = DEFAULT_QUERY_URL
    #: Other Query replicas the Cluster page reports on (``--replica``).
    replicas: tuple[str, ...] = ()
    ca_pem: bytes | None = None
    server_name: str | None = None
    #: The console itself is served over TLS: cookies get the Secure flag.
    https: bool = False
    page_rows: int = DEFAULT_PAGE_ROWS
    range_chunk_bytes: int = RANGE_CHUNK_BYTES
    connect_timeout: float = 30.0
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
