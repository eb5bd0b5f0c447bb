from __future__ import annotations

import pytest

from lake_core import protocol
from lake_core.errors import InvalidArgument, InvalidName
from lake_core.ids import new_operation_id
from lake_core.names import MAX_NAME_LENGTH, TableRef


def test_parse_forms() -> None:
    assert TableRef.parse("robots.episodes") == TableRef("robots", "episodes")
    assert TableRef.parse("lake.robots.episodes") == TableRef("robots", "episodes")
    assert TableRef("robots", "episodes").qualified == "lake.robots.episodes"
    assert str(TableRef("a_1", "_b")) == "a_1._b"


@pytest.mark.parametrize(
    ("namespace", "name", "reason"),
    [
        ("robots", "", "empty"),
        ("", "t", "empty"),
        ("robots", "Episodes", "lowercase"),
        ("robots", "..", "'..'"),
        ("robots", "a/b", "path separator"),
        ("robots", "a.b", "dot"),
        ("robots", "a\x00b", "NUL"),
        ("robots", "x" * (MAX_NAME_LENGTH + 1), "longer"),
        ("robots", "1abc", "lowercase identifier"),
        ("robots", "a-b", "lowercase identifier"),
        ("robots", "é", "lowercase identifier"),
    ],
)
def test_bad_names_are_rejected_with_a_clear_reason(namespace: str, name: str, reason: str) -> None:
    with pytest.raises(InvalidName, match=reason):
        TableRef(namespace, name)


def test_longest_valid_name() -> None:
    assert TableRef("n", "x" * MAX_NAME_LENGTH).name == "x" * MAX_NAME_LENGTH


@pytest.mark.parametrize("text", ["episodes", "a.b.c.d", "other.a.b", "a..b", "", "a."])
def test_parse_rejects_malformed_references(text: str) -> None:
    with pytest.raises(InvalidName):
        TableRef.parse(text)


def test_wire_round_trip_validates() -> None:
    assert TableRef.model_validate_json('{"namespace":"a","name":"b"}') == TableRef("a", "b")
    with pytest.raises(InvalidName):
        TableRef.model_validate_json('{"namespace":"a","name":"../b"}')


def test_every_bit_flip_of_an_encoded_command_decodes_or_is_invalid_argument() -> None:
    """A table reference missing a key inside a wire body is the sender's mistake.

    Pydantic builds the nested reference through ``TableRef.__init__``; before,
    a flipped bit in ``"namespace"`` or ``"name"`` made it a TypeError, which
    Metasrv answered as an internal server error.
    """
    command = protocol.AppendCommand(
        table=TableRef("robots", "episodes"), operation_id=new_operation_id()
    )
    body = protocol.encode(command)
    refused = 0
    for i in range(len(body)):
        for bit in range(8):
            flipped = bytearray(body)
            flipped[i] ^= 1 << bit
            try:
                protocol.decode(protocol.AppendCommand, bytes(flipped))
            except InvalidArgument:
                refused += 1
    assert refused > len(body)  # most flips break it
    with pytest.raises(InvalidName, match="namespace must be a string"):
        protocol.decode(protocol.TableRequest, b'{"table": {"name": "episodes"}}')
    with pytest.raises(InvalidName, match="table name must be a string"):
        protocol.decode(protocol.TableRequest, b'{"table": {"namespace": "robots"}}')
