"""The write gate: whether this Metasrv may change the registry right now.

Every registry-changing operation of the commit coordinator passes the gate
before it starts: create, drop, append (each append on arrival, and each
group again before its commit), maintenance and operation-id pruning. The
gate is chosen at construction: :class:`OpenGate` for a local Metasrv (its
data directory is locked to it) and :class:`LeadershipGate` in cloud mode
(only the lease holder writes). In cloud mode the engine and the registry
check the lease again right before they write, and the registry fences on
the epoch, so a gate passed just before the lease ran out still cannot land
a late write.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lake_metasrv.lease import Leadership

__all__ = ["LeadershipGate", "OpenGate", "WriteGate"]


class WriteGate(abc.ABC):
    """Whether this node may write (see the module docstring)."""

    @abc.abstractmethod
    def check(self) -> None:
        """Return if this node may write now; raise a retryable LakeError if it may not."""

    @abc.abstractmethod
    def is_open(self) -> bool:
        """Whether :meth:`check` would pass now (for background work that just skips)."""


class OpenGate(WriteGate):
    """Always open: a local Metasrv is the only writer of its data directory."""

    def check(self) -> None:
        return None

    def is_open(self) -> bool:
        return True


class LeadershipGate(WriteGate):
    """Open while this node holds a valid leader lease (cloud mode)."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def check(self) -> None:
        self.leadership.epoch()  # raises NotLeader unless the lease is valid and taken over

    def is_open(self) -> bool:
        return self.leadership.is_leader
