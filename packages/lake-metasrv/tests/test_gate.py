"""The write gate: every registry-changing operation passes it, appends included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lance
import pytest

from lake_core.ids import new_operation_id
from lake_core.names import TableRef
from lake_core.protocol import AppendCommand
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.gate import LeadershipGate, OpenGate, WriteGate
from lake_metasrv.lease import Leadership
from lake_metasrv.maintenance import Maintenance
from lake_metasrv.registry.dynamo import NotLeader


class Switch(WriteGate):
    """A gate a test opens and closes; closed, it refuses as a follower does."""

    def __init__(self) -> None:
        self.open = True
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        if not self.open:
            raise NotLeader("this Metasrv is not the leader; retry (writes go to the leader)")

    def is_open(self) -> bool:
        return self.open


def test_a_follower_leadership_gate_is_closed() -> None:
    follower = Leadership(None, "lake_registry", url="")  # never elected
    gate = LeadershipGate(follower)
    assert not gate.is_open()
    with pytest.raises(NotLeader):
        gate.check()
    OpenGate().check()
    assert OpenGate().is_open()


@pytest.mark.asyncio
async def test_an_append_on_a_node_whose_gate_is_closed_is_refused(
    make_coordinator: Callable[..., CommitCoordinator], kit: Any
) -> None:
    coordinator = make_coordinator()
    switch = Switch()
    coordinator.gate = switch
    await coordinator.open()
    try:
        record = await coordinator.create_table(kit.episodes, kit.schema)
        lance_before = lance.dataset(record.location).latest_version

        switch.open = False
        op = new_operation_id()
        command = AppendCommand(table=kit.episodes, operation_id=op)
        checks = switch.checks
        with pytest.raises(NotLeader) as refused:
            await coordinator.append(command, kit.schema, [kit.make_batch(3)])
        assert refused.value.retryable
        assert switch.checks > checks, "the append must have asked the gate"
        # Refused before anything was written: no version, no Lance commit, no sidecar.
        assert (await coordinator.describe_table(kit.episodes)).version == 0
        assert await coordinator.registry.get_operation(op) is None
        assert lance.dataset(record.location).latest_version == lance_before
        assert not coordinator.sidecars.path(record.incarnation, 1).exists()

        # Every other change is refused too.
        with pytest.raises(NotLeader):
            await coordinator.create_table(TableRef("robots", "other"), kit.schema)
        with pytest.raises(NotLeader):
            await coordinator.drop_table(kit.episodes)
        with pytest.raises(NotLeader):
            await Maintenance(coordinator).compact(kit.episodes)

        # Open again (this node became the leader): the same operation commits once.
        switch.open = True
        result = await coordinator.append(command, kit.schema, [kit.make_batch(3)])
        assert (result.version, result.replayed) == (1, False)
    finally:
        await coordinator.close()
