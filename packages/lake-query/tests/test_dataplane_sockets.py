"""drop_connection ends a DoGet blocked in pyarrow's C++ write on a stalled client.

A real pyarrow FlightServerBase in the test process serves an endless
GeneratorStream. A pyarrow client reads one batch and then stops reading (the
reader is kept alive), so the server fills the HTTP/2 window and socket
buffers and blocks in its write. Only shutting the socket down ends that
stream: the generator's ``finally`` must run, and the server must go on
serving other clients.
"""

from __future__ import annotations

import ipaddress
import queue
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from lake_query.dataplane.sockets import drop_connection, parse_peer, supported
from tools.lake_testing.tls import TestCA

needs_proc = pytest.mark.skipif(not supported(), reason="drop_connection needs Linux /proc")

SCHEMA = pa.schema([("x", pa.int64())])
BATCH = pa.record_batch([pa.array(range(8192), pa.int64())], schema=SCHEMA)  # 64 KiB
FINITE_BATCHES = 3
#: Generous bounds for a loaded 2-core machine; each wait returns on its event.
BOUND_S = 20.0


@dataclass
class Stream:
    """One DoGet the server is serving: its peer, how far it got, and whether it ended."""

    peer: str
    pulled: int = 0
    finalized: threading.Event = field(default_factory=threading.Event)


class EndlessServer(flight.FlightServerBase):  # type: ignore[misc]
    """Ticket ``endless``: batches until the client goes; anything else: FINITE_BATCHES."""

    def __init__(self, location: str, **kwargs: object) -> None:
        super().__init__(location, **kwargs)
        self.streams: queue.Queue[Stream] = queue.Queue()

    def do_get(
        self, context: flight.ServerCallContext, ticket: flight.Ticket
    ) -> flight.FlightDataStream:
        stream = Stream(peer=context.peer())
        self.streams.put(stream)
        endless = ticket.ticket == b"endless"

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                while endless or stream.pulled < FINITE_BATCHES:
                    stream.pulled += 1
                    yield BATCH
            finally:
                stream.finalized.set()

        return flight.GeneratorStream(SCHEMA, batches())

    def next_stream(self) -> Stream:
        return self.streams.get(timeout=BOUND_S)


@dataclass
class Served:
    server: EndlessServer
    client_uri: str
    client_options: dict[str, object]
    readers: list[flight.FlightStreamReader] = field(default_factory=list)

    def client(self) -> flight.FlightClient:
        return flight.FlightClient(self.client_uri, **self.client_options)

    def close(self) -> None:
        # shutdown() waits for every stream, so a test that failed with a stalled
        # reader must not leave it for the teardown to hang on.
        for reader in self.readers:
            reader.cancel()
        self.server.shutdown()


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("dataplane-ca"))


# (bind host, client host, TLS): a dual-stack [::] listener sees an IPv4 client
# as ::ffff:127.0.0.1 in /proc/net/tcp6 while gRPC reports "ipv4:127.0.0.1:...".
SETUPS = {
    "ipv4": ("127.0.0.1", "127.0.0.1", False),
    "ipv4-tls": ("127.0.0.1", "127.0.0.1", True),
    "ipv6": ("[::1]", "[::1]", False),
    "ipv6-tls": ("[::1]", "[::1]", True),
    "dual-stack": ("[::]", "127.0.0.1", False),
}


@pytest.fixture(params=list(SETUPS))
def served(request: pytest.FixtureRequest, ca: TestCA, tmp_path: Path) -> Iterator[Served]:
    bind, host, tls = SETUPS[request.param]
    if "[" in bind and not has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    server_options: dict[str, object] = {}
    client_options: dict[str, object] = {}
    scheme = "grpc+tcp"
    if tls:
        cert = ca.issue("localhost", ip_addresses=("127.0.0.1", "::1"))
        server_options["tls_certificates"] = [
            (cert.cert_file.read_bytes(), cert.key_file.read_bytes())
        ]
        client_options["tls_root_certs"] = ca.cert_pem
        scheme = "grpc+tls"
    server = EndlessServer(f"{scheme}://{bind}:0", **server_options)
    served = Served(server, f"{scheme}://{host}:{server.port}", client_options)
    try:
        yield served
    finally:
        served.close()


def stall(served: Served) -> tuple[flight.FlightClient, flight.FlightStreamReader, Stream]:
    """A client that read one batch and stopped, and the server stream blocked writing to it."""
    client = served.client()
    reader = client.do_get(flight.Ticket(b"endless"))
    served.readers.append(reader)
    reader.read_chunk()
    stream = served.server.next_stream()
    # Blocked once the generator is no longer asked for batches (windows and buffers
    # full). There is no event for "blocked in C++", so watch the pull count settle.
    deadline = time.monotonic() + BOUND_S
    last = -1
    while stream.pulled != last:
        assert time.monotonic() < deadline, "the server never blocked on the stalled client"
        last = stream.pulled
        time.sleep(0.25)
    assert not stream.finalized.is_set()
    return client, reader, stream


def read_to_end(reader: flight.FlightStreamReader) -> None:
    while True:
        reader.read_chunk()


def read_finite(served: Served) -> None:
    client = served.client()
    try:
        table = client.do_get(flight.Ticket(b"finite")).read_all()
    finally:
        client.close()
    assert table.num_rows == FINITE_BATCHES * BATCH.num_rows
    assert served.server.next_stream().finalized.wait(BOUND_S)


@needs_proc
def test_dropping_a_stalled_connection_finalizes_the_stream(served: Served) -> None:
    client, reader, stream = stall(served)
    started = time.monotonic()
    assert drop_connection(served.server.port, stream.peer) is True
    assert stream.finalized.wait(BOUND_S), "the generator's finally never ran"
    assert time.monotonic() - started < BOUND_S
    # The client sees the connection gone once it reads past what was buffered.
    with pytest.raises(flight.FlightUnavailableError):
        read_to_end(reader)
    read_finite(served)  # the server takes the next client
    # The dropped client's channel reconnects for its next call.
    assert (
        client.do_get(flight.Ticket(b"finite")).read_all().num_rows
        == FINITE_BATCHES * BATCH.num_rows
    )
    assert served.server.next_stream().finalized.wait(BOUND_S)
    client.close()


@needs_proc
def test_without_drop_the_stalled_stream_stays_blocked(served: Served) -> None:
    # The control: what drop_connection fixes does not fix itself.
    _client, reader, stream = stall(served)
    assert not stream.finalized.wait(1.0)
    reader.cancel()
    assert stream.finalized.wait(BOUND_S)


@needs_proc
def test_a_peer_that_does_not_exist_closes_nothing(served: Served) -> None:
    client, reader, stream = stall(served)
    address, port = parse_peer(stream.peer)
    other_port = port + 1 if port < 65535 else port - 1
    host = str(address) if address.version == 4 else f"[{address}]"
    family = f"ipv{address.version}"
    assert drop_connection(served.server.port, f"{family}:{host}:{other_port}") is False
    other_address = "127.0.0.2" if address.version == 4 else "[::2]"
    assert drop_connection(served.server.port, f"{family}:{other_address}:{port}") is False
    wrong_local = served.server.port + 1 if served.server.port < 65535 else 1
    assert drop_connection(wrong_local, stream.peer) is False
    # The stalled stream is untouched: it still delivers batches when read again.
    for _ in range(stream.pulled + 8):
        reader.read_chunk()
    assert not stream.finalized.is_set()
    reader.cancel()
    assert stream.finalized.wait(BOUND_S)
    client.close()


@pytest.mark.parametrize(
    ("peer", "address", "port"),
    [
        ("ipv4:127.0.0.1:54321", "127.0.0.1", 54321),
        ("ipv4:10.1.2.3:1", "10.1.2.3", 1),
        ("ipv6:[::1]:65535", "::1", 65535),
        ("ipv6:%5B::1%5D:54321", "::1", 54321),  # how pyarrow 26's gRPC spells it
        ("ipv6:%5b2001:db8::7%5d:443", "2001:db8::7", 443),
        ("ipv6:[fe80::1%25eth0]:443", "fe80::1", 443),
        ("ipv6:[::ffff:127.0.0.1]:80", "127.0.0.1", 80),  # an IPv4 client on a dual-stack socket
    ],
)
def test_peer_strings_parse(peer: str, address: str, port: int) -> None:
    assert parse_peer(peer) == (ipaddress.ip_address(address), port)


@pytest.mark.parametrize(
    "peer",
    [
        "",
        "127.0.0.1:80",
        "ipv4:127.0.0.1",
        "ipv4:127.0.0.1:",
        "ipv4:127.0.0.1:0",
        "ipv4:127.0.0.1:65536",
        "ipv4:127.0.0.1:080",
        "ipv4:127.0.0.1:-1",
        "ipv4:256.0.0.1:80",
        "ipv4:127.0.0.01:80",
        "ipv4:127.0.0:80",
        "ipv4:[::1]:80",
        "ipv4:127.0.0.1:80 ",
        " ipv4:127.0.0.1:80",
        "IPV4:127.0.0.1:80",
        "ipv6:::1:80",
        "ipv6:[::1]",
        "ipv6:[::1]80",
        "ipv6:[127.0.0.1]:80",
        "ipv6:[::1:80",
        "ipv6:%5B::1]:80",
        "ipv6:[:::1]:80",
        "ipv6:[::g]:80",
        "unix:/tmp/lake.sock",
        "ipv4:127.0.0.1:80\n",
    ],
)
def test_malformed_peers_are_value_errors(peer: str) -> None:
    with pytest.raises(ValueError):
        drop_connection(50051, peer)


@pytest.mark.parametrize("local_port", [0, -1, 65536, True, "50051", 50051.0])
def test_malformed_local_ports_are_value_errors(local_port: object) -> None:
    with pytest.raises(ValueError):
        drop_connection(local_port, "ipv4:127.0.0.1:54321")  # type: ignore[arg-type]


def test_non_string_peer_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        drop_connection(50051, b"ipv4:127.0.0.1:54321")  # type: ignore[arg-type]


def test_supported_on_linux() -> None:
    assert supported() is sys.platform.startswith("linux")
