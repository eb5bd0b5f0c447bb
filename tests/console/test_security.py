"""The console's security promises, over plain HTTP against a real Lake and console.

Cookie flags, CSRF refusal, escaping, a foreign tenant's FILE refused, the
token never in a URL or the console's log, and range responses bounded.
"""

from __future__ import annotations

import http.client
import urllib.parse

import pytest

from lake_sdk.console.file_pages import decode_location, encode_location
from tests.console.conftest import SCRIPT, TOKENS, Console
from tools.lake_testing.console import RangeReader, Session

SQL = "SELECT episode_id, note, video FROM robots.episodes ORDER BY episode_id"
MIB = 1024 * 1024


def _location_link(session: Session) -> str:
    """The ``/file?loc=...`` of row 0's video, as the episode page links it."""
    page = session.request("/episode?" + urllib.parse.urlencode({"sql": SQL, "row": "0"})).text
    start = page.index('src="/file?loc=') + len('src="')
    return page[start : page.index('"', start)]


def test_cookie_flags_csrf_and_escaping(console: Console) -> None:
    session = Session(console.url)
    # Sign-in without the form's CSRF token is refused and sets no session.
    assert session.request("/signin", {"token": TOKENS["acme"]}).status == 403
    assert session.request("/signin", {"token": TOKENS["acme"], "csrf": "0" * 64}).status == 403
    assert not any(c.name == "lake_session" for c in session.jar)
    reply = session.sign_in(TOKENS["acme"])
    cookie = next(
        v for k, v in reply.headers.items() if k.lower() == "set-cookie" and "lake_session=" in v
    )
    flags = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    # The token is in the cookie only: not in the redirect, not in any page.
    assert TOKENS["acme"] not in reply.headers.get("location", "")
    page = session.request("/query?" + urllib.parse.urlencode({"sql": SQL}))
    assert page.status == 200
    assert TOKENS["acme"] not in page.text
    # A cell holding a script tag is text, never markup.
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page.text
    assert SCRIPT not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    # A state-changing request without (or with a wrong) CSRF token is refused.
    assert session.request("/signout", {}).status == 403
    assert session.request("/signout", {"csrf": "f" * 64}).status == 403
    assert session.request("/tables").status == 200  # still signed in
    assert session.request("/signout", {"csrf": session.csrf("/tables")}).status == 303
    assert session.request("/tables").status == 303  # signed out: to the sign-in form


def test_odd_sign_in_and_sign_out_posts_are_refused_typed(console: Console) -> None:
    """Anyone can post these forms: a huge one or a non-ASCII CSRF field was a 500 before."""
    session = Session(console.url)
    csrf = session.csrf("/signin")
    huge = session.request("/signin", {"csrf": csrf, "token": "x" * (128 * 1024)})
    assert huge.status == 413
    assert huge.text.startswith("InvalidArgument: the form is larger than")
    odd = session.request("/signin", {"csrf": "\xff" * 64, "token": TOKENS["acme"]})
    assert odd.status == 403
    assert not any(c.name == "lake_session" for c in session.jar)
    session.sign_in(TOKENS["acme"])
    assert session.request("/signout", {"csrf": "\u00e9"}).status == 403
    assert session.request("/signout", {"csrf": "0" * (128 * 1024)}).status == 413
    assert session.request("/tables").status == 200  # still signed in


def test_wrong_token_is_refused_typed(console: Console) -> None:
    session = Session(console.url)
    reply = session.request("/signin", {"csrf": session.csrf("/signin"), "token": "lk_wrong"})
    assert reply.status == 401
    assert "Unauthenticated" in reply.text
    odd = session.request("/signin", {"csrf": session.csrf("/signin"), "token": "lk;secret"})
    assert odd.status == 401
    assert ">Unauthenticated</strong>" in odd.text
    assert "lk;secret" not in odd.text
    assert not any(c.name == "lake_session" for c in session.jar)


def test_a_token_holding_cookie_delimiters_signs_in(console: Console) -> None:
    """Tokens are any visible ASCII: one holding cookie delimiters was refused before."""
    session = Session(console.url)
    reply = session.sign_in(TOKENS["odd"])
    cookie = next(
        v for k, v in reply.headers.items() if k.lower() == "set-cookie" and "lake_session=" in v
    )
    assert TOKENS["odd"] not in cookie
    page = session.request("/query?" + urllib.parse.urlencode({"sql": SQL}))
    assert page.status == 200, page.text[-500:]
    assert TOKENS["odd"] not in page.text
    assert session.request("/signout", {"csrf": session.csrf("/tables")}).status == 303
    assert session.request("/tables").status == 303
    # A session cookie this console did not write is no session.
    session.jar.clear()
    forged = session.request("/tables", headers={"Cookie": "lake_session=%%%"})
    assert forged.status == 303


def test_foreign_tenant_file_is_refused(console: Console) -> None:
    acme = Session(console.url)
    acme.sign_in(TOKENS["acme"])
    link = _location_link(acme)
    assert acme.request(link, headers={"Range": "bytes=0-99"}).status == 206
    globex = Session(console.url)
    globex.sign_in(TOKENS["globex"])
    for headers in ({"Range": "bytes=0-99"}, {}):
        refused = globex.request(link, headers=headers)
        assert refused.status == 403, refused.text
        assert refused.text.startswith("LocationOutsideStage:")
    assert Session(console.url).request(link).status == 401  # not signed in at all


def test_file_bytes_claiming_a_scriptable_type_download_sandboxed(console: Console) -> None:
    """A link's media type is the caller's word: HTML or SVG bytes never render as a page.

    Anyone of the tenant can write a FILE value (or craft a link) claiming
    ``text/html``; served inline it would be a page of the console's origin,
    and ``script-src 'self'`` would let it load a script from ``/file`` too.
    """
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    link = _location_link(session)
    video = session.request(link, headers={"Range": "bytes=0-9"})
    assert video.status == 206
    assert "content-disposition" not in video.headers  # plays inline
    assert "sandbox" in video.headers["content-security-policy"]
    location = decode_location(link.removeprefix("/file?loc=")).model_dump()
    for media_type in ("text/html", "image/svg+xml", "application/javascript", "TEXT/HTML; x"):
        forged = "/file?loc=" + encode_location({**location, "media_type": media_type})
        for headers in ({"Range": "bytes=0-9"}, {}):
            reply = session.request(forged, headers=headers)
            assert reply.status in (200, 206), reply.text
            assert reply.headers["content-disposition"] == "attachment", media_type
            policy = reply.headers["content-security-policy"]
            assert policy.startswith("sandbox;")
            assert "script-src" not in policy


def test_a_whole_object_failing_its_sha256_never_arrives_whole(console: Console) -> None:
    """A plain GET is checked against the SHA-256 at its end: a mismatch must cut it short.

    Here the link declares the wrong digest (as a corrupted object's link
    would find it); the client must see a broken download, never a complete
    200 of the wrong bytes.
    """
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    location = decode_location(_location_link(session).removeprefix("/file?loc=")).model_dump()
    forged = "/file?loc=" + encode_location({**location, "sha256": "0" * 64})
    with pytest.raises(http.client.IncompleteRead):
        session.request(forged)
    session.close()
    # The range path does not check the whole object's digest; the object itself is fine.
    assert session.request(forged, headers={"Range": "bytes=0-9"}).status == 206


def _peak_rss(console: Console) -> int:
    with open(f"/proc/{console.proc.pid}/status") as status:
        line = next(x for x in status if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_range_reads_are_exact_and_bounded(console: Console) -> None:
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    link = _location_link(session)
    data = console.video.read_bytes()
    size = len(data)
    reply = session.request(link, headers={"Range": "bytes=1000-1999"})
    assert reply.status == 206
    assert reply.headers["content-range"] == f"bytes 1000-1999/{size}"
    assert reply.body == data[1000:2000]
    suffix = session.request(link, headers={"Range": "bytes=-10"})
    assert suffix.body == data[-10:]
    assert session.request(link, headers={"Range": f"bytes={size}-"}).status == 416
    # Open-ended ranges get at most one chunk (4 MiB); reading the whole object
    # that way, the console's peak memory grows by far less than the object.
    baseline = _peak_rss(console)
    start, parts = 0, []
    while start < size:
        part = session.request(link, headers={"Range": f"bytes={start}-"})
        assert part.status == 206
        assert len(part.body) <= 4 * MIB
        parts.append(part.body)
        start += len(part.body)
    assert b"".join(parts) == data
    assert _peak_rss(console) - baseline < 16 * MIB
    # A plain GET streams the whole object, verified.
    whole = session.request(link)
    assert whole.status == 200
    assert whole.body == data
    # The token never reached the console's log (access lines carry URLs only).
    assert TOKENS["acme"] not in console.log()
    assert "GET /file?loc=" in console.log()


def test_the_benchmarks_range_reader_gets_exactly_what_a_session_gets(console: Console) -> None:
    """``RangeReader`` (the seek benchmark's client) reads exact bytes on one kept-alive connection."""
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    link = _location_link(session)
    data = console.video.read_bytes()
    size = len(data)
    reader = RangeReader(session, 4 * MIB)
    try:
        for start, end in ((0, None), (1000, 2000), (size - 10, None), (size // 2, None)):
            body = reader.get(link, start, end)
            expected = data[start : min(end or size, start + 4 * MIB)]
            assert bytes(body) == expected
            assert (
                body
                == session.request(
                    link, headers={"Range": f"bytes={start}-{'' if end is None else end - 1}"}
                ).body
            )
        # Not a 206 (an unsatisfiable range): refused, and the connection replaced.
        with pytest.raises(AssertionError, match="expected 206"):
            reader.get(link, size)
        assert bytes(reader.get(link, 0, 10)) == data[:10]
    finally:
        reader.close()
