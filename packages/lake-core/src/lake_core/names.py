"""Table identifiers: validated before any I/O."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from lake_core.errors import InvalidName

__all__ = ["DEFAULT_CATALOG", "MAX_NAME_LENGTH", "TableRef", "validate_identifier"]

DEFAULT_CATALOG = "lake"
MAX_NAME_LENGTH = 63
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def validate_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a lowercase identifier, else raise InvalidName."""
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a string, got {type(value).__name__}")
    shown = repr(value[:80])
    if not value:
        raise InvalidName(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidName(f"{what} {shown} is longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in value:
        raise InvalidName(f"{what} {shown} contains a NUL byte")
    if "/" in value or "\\" in value or ".." in value:
        raise InvalidName(f"{what} {shown} contains a path separator or '..'")
    if "." in value:
        raise InvalidName(f"{what} {shown} contains a dot; a name part cannot")
    if not _IDENTIFIER.fullmatch(value):
        raise InvalidName(
            f"{what} {shown} is not a lowercase identifier "
            "(letters a-z, digits and '_', not starting with a digit)"
        )
    return value


class TableRef(BaseModel):
    """A native table's identity: ``namespace.name`` in the ``lake`` catalog."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str

    @model_validator(mode="before")
    @classmethod
    def _validate(cls, data: Any) -> Any:
        if isinstance(data, dict):
            validate_identifier(data.get("namespace"), "namespace")
            validate_identifier(data.get("name"), "table name")
        return data

    def __init__(self, namespace: str | None = None, name: str | None = None, **_: Any) -> None:
        # Pydantic builds a nested reference (a command's "table") through this
        # __init__: a body without one of the keys reaches the validator as None
        # (InvalidName), not as a TypeError here (an internal error).
        super().__init__(namespace=namespace, name=name)

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """Parse ``ns.table`` or ``lake.ns.table``."""
        if not isinstance(text, str):
            raise InvalidName(f"table reference must be a string, got {type(text).__name__}")
        parts = text.split(".")
        if len(parts) == 3 and parts[0] == DEFAULT_CATALOG:
            parts = parts[1:]
        if len(parts) != 2:
            raise InvalidName(
                f"table reference {text[:80]!r} must be 'namespace.table' or 'lake.namespace.table'"
            )
        return cls(parts[0], parts[1])

    def __str__(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def qualified(self) -> str:
        return f"{DEFAULT_CATALOG}.{self.namespace}.{self.name}"
