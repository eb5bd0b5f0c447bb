"""The ``mcap`` libraries, imported only when a recording is touched.

``lake-sdk`` does not depend on them: its ``mcap`` extra adds ``mcap`` and
``mcap-ros2-support``. Without them every recording call raises
:class:`~lake_sdk.errors.MissingExtra` naming what installs them
(:func:`lake_core.install.extra_hint`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lake_core.install import extra_hint
from lake_sdk.errors import MissingExtra

__all__ = ["require"]


def require(module: str) -> ModuleType:
    """Import ``module`` (``mcap.reader``, ``mcap_ros2.decoder``, ...) or raise MissingExtra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{module} is not installed: MCAP recordings need it: {extra_hint('lake-sdk', 'mcap')}",
            name=module.partition(".")[0],
        ) from None
