"""Names kept for one release: the 0.1 surface (LakeClient, connect, builders), the
``Sync*`` and ``*_async`` names of 0.2, and the module paths that became private."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated", "is_deprecated", "moved_module", "warn"]

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__lake_deprecated__"


def warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def deprecated(old: str, new: str) -> Callable[[F], F]:
    """Mark a function (or method) as a deprecated alias: it warns on every call."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn(old, new)
            return fn(*args, **kwargs)

        setattr(wrapper, _MARK, True)
        return wrapper  # type: ignore[return-value]

    return decorate


def is_deprecated(value: object) -> bool:
    return bool(getattr(getattr(value, "__func__", value), _MARK, False))


def moved_module(old: str, new: str, renamed: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the old path ``old`` of the private module ``new``.

    Every name read through the old path warns and comes from ``new`` (under
    its new name when ``renamed`` maps it); the public names are importable
    from :mod:`lake_sdk` itself.
    """

    def __getattr__(name: str) -> Any:
        import importlib

        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        current = (renamed or {}).get(name, name)
        value = getattr(importlib.import_module(new), current)
        public = importlib.import_module("lake_sdk").__all__
        warn(f"{old}.{name}", f"lake_sdk.{current}" if current in public else f"{new}.{current}")
        return value

    return __getattr__
