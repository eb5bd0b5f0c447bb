"""The ``mcap`` libraries, imported only when a recording is touched.

``lake-sdk`` does not depend on them: ``pip install 'lake-sdk[mcap]'`` adds
``mcap`` and ``mcap-ros2-support``. Without them every recording call raises
:class:`~lake_sdk.errors.MissingExtra` naming that install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lake_sdk.errors import MissingExtra

__all__ = ["INSTALL_HINT", "require"]

INSTALL_HINT = "pip install 'lake-sdk[mcap]'"


def require(module: str) -> ModuleType:
    """Import ``module`` (``mcap.reader``, ``mcap_ros2.decoder``, ...) or raise MissingExtra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{module} is not installed: MCAP recordings need {INSTALL_HINT}",
            name=module.partition(".")[0],
        ) from None
