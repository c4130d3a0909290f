"""The run's timeline in the bucket: the writer the supervisor's log copy adds (workloads/run_logs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workloads.run_logs import DirectorySink, LogCopier
from workloads.run_record import Attempt, RunRecord

# Ray's job table entry (GET /api/jobs/: JobDetails, start_time/end_time in ms since the epoch).
JOB = {"submission_id": "verl-grpo-1", "status": "RUNNING", "start_time": 1_796_644_800_000, "end_time": None,
       "driver_node_id": "n1"}


class Ray:
    """The head's two answers the copy reads: the job table and a job's log tail (RayJobs' shapes)."""

    def __init__(self) -> None:
        self.job: dict[str, Any] = dict(JOB)
        self.lines = ["INFO worker.py:1852 -- Connecting to existing Ray cluster"]

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {self.job["submission_id"]: self.job}

    def log_tail(self, job: Any, lines: int) -> list[str]:
        return list(self.lines)


def test_the_copy_records_the_jobs_start_and_end_and_when_each_verl_step_was_first_seen(tmp_path: Path) -> None:
    ray, now, wall = Ray(), [0.0], [1_796_645_000.0]
    record = RunRecord("run-1", attempts=(Attempt(0, "verl-grpo-1", "pulumi-up", "pulumi-up"),))
    copier = LogCopier(ray, DirectorySink(tmp_path), lambda: {"run-1": record}, clock=lambda: now[0],
                       log=lambda _line: None, wall=lambda: wall[0])
    timeline = tmp_path / "logs" / "run-1" / "timeline.jsonl"
    copier.tick()
    ray.lines.append("\x1b[36m(TaskRunner pid=42)\x1b[0m step:1 - timing_s/step:310.5 - critic/score/mean:0.1")
    now[0], wall[0] = 60.0, 1_796_645_300.0
    copier.tick()
    ray.lines.append("(TaskRunner pid=42) step:2 - timing_s/step:120.0")
    ray.job.update(status="SUCCEEDED", end_time=1_796_645_400_500)
    now[0], wall[0] = 120.0, 1_796_645_420.0
    copier.tick()
    assert [json.loads(line) for line in timeline.read_text().splitlines()] == [
        {"attempt": 0, "event": "job-start", "at": 1_796_644_800.0, "clock": "head"},
        {"attempt": 0, "event": "step", "step": 1, "at": 1_796_645_300.0, "clock": "supervisor"},
        {"attempt": 0, "event": "job-end", "at": 1_796_645_400.5, "clock": "head", "status": "SUCCEEDED"},
        {"attempt": 0, "event": "step", "step": 2, "at": 1_796_645_420.0, "clock": "supervisor"},
    ]
    # A restarted supervisor keeps what the bucket has: a step's first sighting is not moved.
    again = LogCopier(ray, DirectorySink(tmp_path), lambda: {"run-1": record}, clock=lambda: 0.0,
                      log=lambda _line: None, wall=lambda: 1_796_646_000.0)
    again.flush()
    assert len(timeline.read_text().splitlines()) == 4
