"""Recorded histories replay against the current workflow code: running tasks stay safe."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from waystation.activities.payload_codec import data_converter
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.run import AgentRun
from waystation.workflows.scheduled_turn import ScheduledTurnWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_there_are_recorded_histories() -> None:
    assert len(HISTORIES) >= 3


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_without_nondeterminism(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[AgentWorkflow, ScheduledTurnWorkflow], data_converter=pydantic_data_converter
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


@pytest.mark.parametrize("path", HISTORIES[:3], ids=[p.stem for p in HISTORIES[:3]])
async def test_our_converter_reads_and_writes_the_bytes_temporals_pydantic_one_does(
    path: Path,
) -> None:
    """Workers and clients use waystation.activities.payload_codec's converter (cheaper to
    build, once per
    activation); what it writes and reads must not differ from Temporal's pydantic one."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    started = history.events[0].workflow_execution_started_event_attributes.input.payloads
    ours = data_converter(None)
    [theirs_run] = await pydantic_data_converter.decode(started, [AgentRun])
    [our_run] = await ours.decode(started, [AgentRun])
    assert our_run == theirs_run
    assert await ours.encode([our_run]) == await pydantic_data_converter.encode([theirs_run])
