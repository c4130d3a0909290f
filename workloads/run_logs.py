"""Logs that outlive the cluster: each attempt's driver log and the run's decisions, copied to the
run's folder `logs/<run id>/` of the bucket while the run goes on and flushed before the release.

Standard library only: it ships into the cluster with the run supervisor, the run's one decider, which
copies them: record.json, decisions.log (every decision, one a line), attempt-<N>.log (its last
LOG_COPY_LINES lines) and timeline.jsonl (for `verl-gke report`). Through the GCS JSON API with the
pod's own Workload Identity (GcsSink over workloads/gcs.py), or into a directory (DirectorySink).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from workloads.gcs import Gcs
from workloads.run_lifecycle import TERMINAL, RayJobs
from workloads.run_record import RunRecord

LOGS_DIR = "logs"
"""domain.bucket.LOGS_DIR (a test holds them equal: workloads import nothing from domain)."""
COPY_EVERY_S = 60.0
"""The copy is at most this far behind the head (the supervisor's own clock)."""
FLUSH_DEADLINE_S = 120.0
"""How long the release waits for the last copy before it releases anyway (and records the cut)."""
LOG_COPY_LINES = 20000
"""The tail of each driver log that is copied: the supervisor's pod has 256 MiB, a log may have GBs."""
RECORD_FILE, DECISIONS_FILE, TIMELINE_FILE = "record.json", "decisions.log", "timeline.jsonl"
# verl's console line of a training step (verl_gke.metrics parses its values).
_VERL_STEP = re.compile(r"(?:^|[\s)\]])step:(\d+) - ")


def run_folder(run_id: str) -> str:
    return f"{LOGS_DIR}/{run_id}"


def attempt_file(index: int) -> str:
    return f"attempt-{index}.log"


class Sink(Protocol):
    def read(self, name: str) -> str | None: ...

    def write(self, name: str, text: str) -> None: ...


@dataclass
class DirectorySink:
    """Objects as files under `root` (the bucket's mount point, or a test's folder)."""

    root: Path

    def read(self, name: str) -> str | None:
        try:
            return (self.root / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write(self, name: str, text: str) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)  # a reader never sees half a copy


@dataclass
class GcsSink:
    """Text objects of a bucket through the GCS JSON API (objects.get with alt=media, objects.insert with
    uploadType=media), authenticated by the GKE metadata server's token of the pod's Kubernetes service
    account (Workload Identity): workloads/gcs.py's client, each request bounded."""

    gcs: Gcs

    def read(self, name: str) -> str | None:
        body = self.gcs.media(name)
        return None if body is None else body.decode("utf-8", errors="replace")

    def write(self, name: str, text: str) -> None:
        self.gcs.put(name, text.encode(), "text/plain; charset=utf-8")


def timeline_events(index: int, job: Mapping[str, object], lines: list[str], now: float) -> list[dict[str, object]]:
    """What one copy of attempt `index` shows: its job's start and end (Ray's start_time/end_time, ms on the
    head's clock) and each verl step in its log, stamped `now` (this copy's wall clock)."""
    events: list[dict[str, object]] = []
    for event, key in (("job-start", "start_time"), ("job-end", "end_time")):
        millis = job.get(key)
        if isinstance(millis, int | float) and millis:
            events.append({"attempt": index, "event": event, "at": millis / 1000, "clock": "head",
                           **({"status": job.get("status")} if event == "job-end" else {})})
    steps = sorted({int(m.group(1)) for line in lines if (m := _VERL_STEP.search(line))})
    events += [{"attempt": index, "event": "step", "step": step, "at": now, "clock": "supervisor"} for step in steps]
    return events


def merged_timeline(old: str | None, events: list[dict[str, object]]) -> str:
    """timeline.jsonl with the events it has no line for yet (a step's or a job's first sighting stays)."""
    lines = (old or "").splitlines()
    seen = {_event_key(json.loads(line)) for line in lines if line.strip()}
    for event in events:
        if _event_key(event) not in seen:
            seen.add(_event_key(event))
            lines.append(json.dumps(event, sort_keys=True))
    return "".join(f"{line}\n" for line in lines)


def _event_key(event: Mapping[str, object]) -> tuple[object, ...]:
    return (event.get("attempt"), event.get("event"), event.get("step"))


def merged_decisions(old: str | None, record: RunRecord) -> str:
    """decisions.log with the record's decisions it does not hold yet appended (each is stamped, so a
    line is one decision)."""
    lines = (old or "").splitlines()
    seen = set(lines)
    return "".join(f"{line}\n" for line in [*lines, *(d for d in record.decisions if d not in seen)])


@dataclass
class LogCopier:
    """Copies the logs of every run of one cluster into `sink`, at most every `every_s` (tick), and all
    that is left before a release (flush)."""

    ray: RayJobs
    sink: Sink
    records: Callable[[], Mapping[str, RunRecord]]
    clock: Callable[[], float] = time.monotonic
    log: Callable[[str], None] = print
    every_s: float = COPY_EVERY_S
    wall: Callable[[], float] = time.time
    """The timeline's stamps (for people; never compared by a decision)."""
    _last: float | None = None
    _final: set[str] = field(default_factory=set)
    """Attempts whose ended log was copied (this process: a restart copies them once more)."""
    _written: dict[str, str] = field(default_factory=dict)
    """What this process last wrote to each object: an unchanged one is not written again."""

    def tick(self) -> None:
        """A copy when the last one is `every_s` old; a failure is logged, never raised (the step goes on)."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        try:
            self.copy(deadline=now + self.every_s, released=False)
        except Exception as error:  # noqa: BLE001 - a copy that failed is tried at the next tick
            self.log(f"run logs: copy failed, retried in {self.every_s:g} s: {error!r}"[:500])

    def copy(self, deadline: float, released: bool) -> None:
        """Copies what changed, oldest run first; the logs of released runs only when `released` (the
        flush: their head is about to go; after it, there is none to ask). TimeoutError once `deadline`
        (this clock) passed."""
        records = self.records()
        due = [a for r in records.values() if released or not r.released for a in r.attempts
               if a.submission_id not in self._final]
        jobs = self.ray.jobs() if due else {}
        for run_id, record in sorted(records.items()):
            folder = run_folder(run_id)
            for attempt in record.attempts if released or not record.released else ():
                job = jobs.get(attempt.submission_id)
                if job is None or attempt.submission_id in self._final:
                    continue
                if self.clock() >= deadline:
                    raise TimeoutError(f"{attempt.submission_id} not copied yet")
                lines = self.ray.log_tail(job, lines=LOG_COPY_LINES)
                self._write(f"{folder}/{attempt_file(attempt.index)}", "".join(f"{line}\n" for line in lines))
                name = f"{folder}/{TIMELINE_FILE}"
                old = self._written[name] if name in self._written else self.sink.read(name)
                self._write(name, merged_timeline(old, timeline_events(attempt.index, job, lines, self.wall())))
                if job.get("status") in TERMINAL:
                    self._final.add(attempt.submission_id)
            text = record.to_json()
            if self._written.get(f"{folder}/{RECORD_FILE}") != text:
                self._write(f"{folder}/{DECISIONS_FILE}",
                            merged_decisions(self.sink.read(f"{folder}/{DECISIONS_FILE}"), record))
                self._write(f"{folder}/{RECORD_FILE}", text)

    def _write(self, name: str, text: str) -> None:
        if self._written.get(name) != text:
            self.sink.write(name, text)
            self._written[name] = text

    def flush(self, deadline_s: float = FLUSH_DEADLINE_S) -> str:
        """Everything left, within `deadline_s`: '' when done, else why the copy was cut."""
        started = self.clock()
        try:
            self.copy(deadline=started + deadline_s, released=True)
        except Exception as error:  # noqa: BLE001 - the release goes on all the same
            return f"log copy cut after {self.clock() - started:.0f} s: {error!r}"[:300]
        self._last = self.clock()
        return ""

