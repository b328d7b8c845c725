"""A worker's slot: one attempt at a time, in a stage process of its own kept warm from
task to task, its moves counted in a rollup row of its own (``pipeline.lifecycle.rollups``:
one writer per row, so that concurrent ends never contend on a counter)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.lifecycle import tasks
from pipeline.settings import Settings
from worker.child import StageProcess


@dataclass
class Slot:
    """What one of a worker's slots keeps from task to task: its terminal counter and its
    warm stage process."""

    counter: tasks.TerminalCounter
    process: StageProcess | None = None

    def stage_process(self, settings: Settings) -> StageProcess:
        """The slot's stage process, a new one if the last was killed, failed or is spent."""
        if self.process is None or not self.process.usable():
            self.close()
            self.process = StageProcess(settings)
        return self.process

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None
