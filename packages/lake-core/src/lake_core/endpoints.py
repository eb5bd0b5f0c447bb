"""The URL schemes of Lake endpoints, in one table.

Users write ``grpc://host:port`` or ``http://host:port`` for plaintext and
``grpc+tls://host:port`` or ``https://host:port`` for TLS; pyarrow's Flight
client wants ``grpc+tcp://`` or ``grpc+tls://``, gRPC channels a bare
``host:port``. Every client and config check reads this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCHEMES", "Endpoint", "Scheme", "parse_endpoint"]


@dataclass(frozen=True)
class Scheme:
    prefix: str
    tls: bool
    #: The scheme pyarrow's Flight client takes for the same endpoint.
    flight: str


SCHEMES: tuple[Scheme, ...] = (
    Scheme("grpc://", tls=False, flight="grpc+tcp://"),
    Scheme("http://", tls=False, flight="grpc+tcp://"),
    Scheme("grpc+tcp://", tls=False, flight="grpc+tcp://"),
    Scheme("grpc+tls://", tls=True, flight="grpc+tls://"),
    Scheme("https://", tls=True, flight="grpc+tls://"),
)


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint URL: its scheme and ``host:port``."""

    scheme: Scheme
    target: str

    @property
    def tls(self) -> bool:
        return self.scheme.tls

    @property
    def flight_location(self) -> str:
        return self.scheme.flight + self.target


def parse_endpoint(url: str) -> Endpoint | None:
    """The endpoint ``url`` names, or None when its scheme is not one of :data:`SCHEMES`."""
    for scheme in SCHEMES:
        if url.startswith(scheme.prefix):
            return Endpoint(scheme, url[len(scheme.prefix) :].rstrip("/"))
    return None
