"""Names kept for one release after the 0.1 surface (LakeClient, connect, builders)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["deprecated", "is_deprecated", "warn"]

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
