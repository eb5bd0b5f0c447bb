"""Arm :mod:`lake_core.faults` points in test processes and in the servers they start."""

from __future__ import annotations

from collections.abc import Mapping

from lake_core import faults
from lake_core.faults import FAULTS

__all__ = ["fault_env", "reset_process_faults"]


def fault_env(*entries: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{LAKE_FAULTS: ...}`` arming ``entries`` on top of any already armed in ``base``.

    Entries are point names (``faults.BEFORE_LANCE_COMMIT``) or ``setting=value``.
    Checked here, so a typo fails the test instead of starting an unarmed server.
    """
    armed = [e for e in (base or {}).get(FAULTS, "").split(",") if e.strip()]
    spec = ",".join([*armed, *entries])
    faults.Faults.parse(spec)
    return {FAULTS: spec}


def reset_process_faults() -> None:
    """Disarm this test process (after a test armed it through its own environment)."""
    faults.configure({})
