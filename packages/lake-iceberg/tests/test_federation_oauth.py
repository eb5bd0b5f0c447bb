"""OAuth single flight when the renewal's leader is interrupted: followers share its failure.

A stand-in HTTP session (the only way to interrupt a thread mid-exchange
deterministically); the real catalog's behaviour is covered by
tests/iceberg/test_federation_rest.py.
"""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
import urllib3

from lake_core.errors import Unavailable
from lake_iceberg.federation.config import FederationConfig
from lake_iceberg.federation.rest import RestClient

ENV = {
    "LAKE_ICEBERG_REST_ENDPOINT": "http://127.0.0.1:9",
    "LAKE_ICEBERG_WAREHOUSE": "s3://w/",
    "LAKE_ICEBERG_NAMESPACES": "ns",
    "LAKE_ICEBERG_REST_CREDENTIAL": "id:secret",
}


class Interrupted(BaseException):
    pass


def _response(status: int, body: dict[str, Any]) -> requests.Response:
    """A streamed answer, as requests gives the client (it reads bodies from ``raw``)."""
    response = requests.Response()
    response.status_code = status
    data = requests.compat.json.dumps(body).encode()
    response.raw = urllib3.response.HTTPResponse(
        body=io.BytesIO(data), preload_content=False, decode_content=False
    )
    return response


class Session(requests.Session):
    def __init__(self) -> None:
        super().__init__()
        self.posts = 0
        self.refused = 0
        self.renewing = threading.Event()
        self.release = threading.Event()

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if url.endswith("/v1/config"):
            return _response(200, {"defaults": {}, "overrides": {}})
        self.refused += 1
        return _response(401, {"error": {"code": 401}})

    def post(self, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.posts += 1
        if self.posts == 1:
            return _response(200, {"access_token": "first"})
        self.renewing.set()
        self.release.wait(30)
        raise Interrupted


def test_an_interrupted_renewal_leader_hands_its_failure_to_followers() -> None:
    config = FederationConfig.from_env(ENV)
    assert config is not None
    session = Session()
    client = RestClient(config, session=session)
    client.handshake()

    def read() -> str:
        try:
            client.load_table("ns", "t")
        except Interrupted:
            return "leader"
        except Unavailable:
            return "follower"
        return "ok"

    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(read) for _ in range(5)]
        assert session.renewing.wait(30)
        pause = threading.Event()
        for _ in range(3000):  # the four followers wait on the leader's renewal
            pending = client._token.pending
            if pending is not None and len(pending._condition._waiters) == 4:  # type: ignore[attr-defined]
                break
            pause.wait(0.01)
        else:
            pytest.fail("the followers never waited on the renewal")
        session.release.set()
        outcomes = sorted(f.result(30) for f in futures)
    assert outcomes == ["follower"] * 4 + ["leader"]
    assert session.posts == 2  # the first token, then one renewal for all five


class LateRefusal(requests.Session):
    """Refuses every token; the read of table ``late`` answers only once released."""

    def __init__(self) -> None:
        super().__init__()
        self.posts = 0
        self.late_sent = threading.Event()
        self.late_release = threading.Event()

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if url.endswith("/v1/config"):
            return _response(200, {"defaults": {}, "overrides": {}})
        if url.endswith("/late"):
            self.late_sent.set()
            assert self.late_release.wait(30)
        return _response(401, {"error": {"code": 401}})

    def post(self, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.posts += 1
        if self.posts == 1:
            return _response(200, {"access_token": "first"})
        return _response(401, {"error": "invalid_client"})  # every renewal fails


def test_a_refusal_arriving_after_the_renewal_failed_shares_that_failure() -> None:
    config = FederationConfig.from_env(ENV)
    assert config is not None
    session = LateRefusal()
    client = RestClient(config, session=session)
    client.handshake()
    client._bearer()  # the first token
    assert session.posts == 1
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(client.load_table, "ns", "late")  # sent with the first token
        assert session.late_sent.wait(30)
        with pytest.raises(Unavailable):
            client.load_table("ns", "early")  # refused, leads the renewal, which fails
        assert session.posts == 2
        session.late_release.set()  # its refusal of the same token arrives now
        with pytest.raises(Unavailable):
            late.result(30)
    assert session.posts == 2  # the failed renewal was its answer too
    with pytest.raises(Unavailable):
        client.load_table("ns", "later")  # a read sent after the failure tries afresh
    assert session.posts == 3
