"""DataFrames from query results: pandas and polars behind the SDK's extras.

Neither library is a dependency of ``lake-sdk``: the ``pandas`` and ``polars``
extras add one. Without it, :func:`to_pandas` and :func:`to_polars` raise
:class:`~lake_sdk.errors.MissingExtra` naming the ``pip install`` to run
(:mod:`lake_core.install` words every such hint).

A FILE column stays a struct column (``uri``, ``media_type``, ``size_bytes``,
``sha256``): a pandas cell is a ``dict`` and a polars value a ``dict`` too, and
either can be passed back to ``client.open``. Timestamps keep their unit and
time zone (``datetime64[us, UTC]`` in pandas, ``Datetime("us", "UTC")`` in polars).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from lake_core.errors import InvalidArgument
from lake_core.filetype import row_to_location
from lake_core.install import extra_hint
from lake_core.models import DataLocation
from lake_sdk.errors import MissingExtra

__all__ = ["DataFrameResult", "as_location", "require_extra", "to_pandas", "to_polars"]


def require_extra(module: str, extra: str, purpose: str = "DataFrames from Lake") -> ModuleType:
    """Import ``module`` or raise MissingExtra naming what installs ``lake-sdk[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{module} is not installed: {purpose} need it: {extra_hint('lake-sdk', extra)}",
            name=module,
        ) from None


def to_pandas(table: pa.Table) -> Any:
    """``table`` as a ``pandas.DataFrame`` (FILE columns as columns of dicts)."""
    require_extra("pandas", "pandas")
    return table.to_pandas()


def to_polars(table: pa.Table) -> Any:
    """``table`` as a ``polars.DataFrame`` (FILE columns as struct columns)."""
    polars = require_extra("polars", "polars")
    return polars.from_arrow(table)


class DataFrameResult:
    """``to_pandas`` / ``to_polars`` for an async result that has ``to_table``."""

    async def to_table(self) -> pa.Table:
        raise NotImplementedError

    async def to_pandas(self) -> Any:
        """The whole result as a ``pandas.DataFrame`` (needs ``lake-sdk[pandas]``)."""
        require_extra("pandas", "pandas")
        return to_pandas(await self.to_table())

    async def to_polars(self) -> Any:
        """The whole result as a ``polars.DataFrame`` (needs ``lake-sdk[polars]``)."""
        require_extra("polars", "polars")
        return to_polars(await self.to_table())


def as_location(value: DataLocation | Mapping[str, Any]) -> DataLocation:
    """A DataLocation from itself or from a FILE cell of a DataFrame (a dict)."""
    if isinstance(value, DataLocation):
        return value
    if isinstance(value, Mapping):
        try:
            return row_to_location(value)
        except ValidationError as exc:
            raise InvalidArgument(f"not a FILE value: {exc.errors()[0]['msg']}") from None
    raise InvalidArgument(f"expected a DataLocation or a FILE value, got {type(value).__name__}")
