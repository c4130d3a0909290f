"""The measured twin of every model: what a run's own records say each phase took.

Pure: `measure` reads what is already recorded (the bucket's copy of the run: record, decisions,
timeline and verl's `timing_s/*` metrics in the logs; the checkpoints' sizes and times; while the
cluster stands, GKE's and the Kubernetes API's times and image pulls) and returns each phase's seconds
and bytes. A phase measured across two machines' clocks is for people, not for decisions.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_gke import metrics
from workloads.checkpoints import HEAD_PART, MARKER, MODEL_MARKER, PARTS_DIR, SAVED_FILE, STATE_DIR

STEP_KEY = "timing_s/step"
"""verl's wall time of one training step; older verl only `perf/time_per_step` (metrics.STEP_TIME_KEY)."""
SAVE_KEY = "timing_s/save_checkpoint"
TIMING_PREFIX = "timing_s/"
GPU_LABEL = "cloud.google.com/gke-accelerator"
_RANK_FILE = re.compile(r"/actor/(?:model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
_STEP_DIR = re.compile(r"/global_step_(\d+)/")
# `gcloud storage ls -l`: "<size>  <RFC 3339 time>  gs://..." per object.
_LISTED = re.compile(r"^\s*(\d+)\s+(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\s+(gs://\S+)\s*$")
# The kubelet's event (pkg/kubelet/images/image_manager.go): `Successfully pulled image "X" in 1m2.5s (1m3s
# including waiting). Image size: 123 bytes.`
_PULLED = re.compile(r'Successfully pulled image "([^"]+)" in ([0-9hms.]+)(?: \(([0-9hms.]+) including waiting\))?'
                     r"\.(?: Image size: (\d+) bytes\.)?")
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def epoch(stamp: str) -> float | None:
    """An RFC 3339 UTC stamp (`2026-12-07T12:00:00Z`, fractions dropped) as epoch seconds."""
    try:
        return float(calendar.timegm(time.strptime(stamp.split(".")[0].rstrip("Z") + "Z", "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, AttributeError):
        return None


def go_duration(text: str) -> float | None:
    """Go's time.Duration.String() (`1m2.5s`, `850ms`) in seconds."""
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float | None
    start: float | None = None
    """Epoch seconds (for the timeline), None when only the duration is known."""
    bytes: int | None = None
    source: str = ""


@dataclass(frozen=True)
class Save:
    step: int
    bytes: int
    rank_bytes: int
    """The largest rank's shards (what one rank writes to local disk)."""
    nodes: int
    local_s: float | None
    """verl's timing_s/save_checkpoint of that step."""
    copy_s: float | None
    """From verl's announcement (saved.json) to the last file's arrival in the bucket."""


@dataclass(frozen=True)
class Recorded:
    """What a run left behind; '' or None for what could not be read."""

    run_id: str
    logs: str = ""
    timeline: str = ""
    decisions: str = ""
    export_s: float | None = None
    listing: str = ""
    cluster: Mapping[str, Any] | None = None
    nodes: Mapping[str, Any] | None = None
    events: Mapping[str, Any] | None = None
    staging: Mapping[str, Any] | None = None
    """The staging Job (labelled app.kubernetes.io/component=data-staging)."""
    staged: tuple[Mapping[str, Any], ...] = ()
    """Staging's markers in the bucket (workloads/stage_data.py: identity and `files`, path -> bytes)."""
    ray_cluster: Mapping[str, Any] | None = None
    """The RayCluster (KubeRay's status.conditions: RayClusterProvisioned once every pod is ready)."""


@dataclass(frozen=True)
class Measured:
    run_id: str
    phases: tuple[Phase, ...]
    steps: tuple[tuple[int, float], ...]
    step_phases: dict[str, float]
    """Mean seconds per step of each verl timer (`gen`, `update_actor`, ...)."""
    saves: tuple[Save, ...]
    rates: dict[str, float] = field(default_factory=dict)

    @property
    def started(self) -> bool:
        return any(p.seconds is not None for p in self.phases) or bool(self.steps)


def timeline_events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("at"), int | float):
            out.append(event)
    return out


def listed(text: str) -> list[tuple[int, float, str]]:
    """(size, time, url) of each object in a `gcloud storage ls -l` listing."""
    out = []
    for line in text.splitlines():
        match = _LISTED.match(line)
        if match and (at := epoch(match.group(2))) is not None:
            out.append((int(match.group(1)), at, match.group(3)))
    return out


def saves_of(listing: str, save_seconds: Mapping[int, float]) -> tuple[Save, ...]:
    """Each checkpoint in the listing: bytes (verl's files, not verl-gke's records), the largest rank's share,
    the nodes that copied it (their part records), and its copy time from saved.json to the last file."""
    by_step: dict[int, list[tuple[int, float, str]]] = {}
    for size, at, url in listed(listing):
        if (match := _STEP_DIR.search(url)) is not None:
            by_step.setdefault(int(match.group(1)), []).append((size, at, url))
    out = []
    for step, objects in sorted(by_step.items()):
        ours = [o for o in objects if f"/{STATE_DIR}/" in o[2] or o[2].endswith((MARKER, MODEL_MARKER))]
        files = [o for o in objects if o not in ours]
        ranks: dict[int, int] = {}
        for size, _at, url in files:
            if (rank := _RANK_FILE.search(url)) is not None:
                ranks[int(rank.group(2))] = ranks.get(int(rank.group(2)), 0) + size
        saved = next((at for _s, at, url in ours if url.endswith(f"/{SAVED_FILE}")), None)
        # The GPU workers' parts copy at once, one per node; the head's part holds only the trainer's files.
        parts = {url.rsplit("/", 1)[-1] for _s, _at, url in ours if f"/{PARTS_DIR}/" in url} - {f"{HEAD_PART}.json"}
        last = max((at for _s, at, _u in files), default=None)
        out.append(Save(step=step, bytes=sum(s for s, _a, _u in files), rank_bytes=max(ranks.values(), default=0),
                        nodes=max(1, len(parts)), local_s=save_seconds.get(step),
                        copy_s=last - saved if saved is not None and last is not None and last >= saved else None))
    return tuple(out)


def _nodes(nodes: Mapping[str, Any]) -> list[tuple[float, float | None]]:
    """(created, Ready since) of each GPU node."""
    out = []
    for node in nodes.get("items") or []:
        meta = node.get("metadata") or {}
        if GPU_LABEL not in (meta.get("labels") or {}):
            continue
        created = epoch(meta.get("creationTimestamp", ""))
        ready = next((epoch(c.get("lastTransitionTime", "")) for c in (node.get("status") or {}).get("conditions") or []
                      if c.get("type") == "Ready" and c.get("status") == "True"), None)
        if created is not None:
            out.append((created, ready))
    return out


def pulls(events: Mapping[str, Any]) -> list[tuple[str, float, int | None, float | None]]:
    """(image, seconds, bytes, when) of each kubelet `Pulled` event."""
    out = []
    for event in events.get("items") or []:
        if event.get("reason") != "Pulled":
            continue
        match = _PULLED.search(event.get("message", ""))
        if match and (seconds := go_duration(match.group(2))) is not None:
            when = epoch(event.get("lastTimestamp") or event.get("eventTime") or "")
            out.append((match.group(1), seconds, int(match.group(4)) if match.group(4) else None, when))
    return out


def _decision_stamp(decisions: str, needle: str) -> float | None:
    return next((epoch(line.split(" ", 1)[0]) for line in decisions.splitlines() if needle in line), None)


def measure(recorded: Recorded) -> Measured:
    parsed = metrics.parse_log(recorded.logs)
    key = STEP_KEY if parsed.series(STEP_KEY) else metrics.STEP_TIME_KEY
    steps = tuple(parsed.series(key))
    timers: dict[str, list[float]] = {}
    for record in parsed.steps:
        for name, value in record.values.items():
            if name.startswith(TIMING_PREFIX) and name not in (STEP_KEY, SAVE_KEY):
                timers.setdefault(name.removeprefix(TIMING_PREFIX), []).append(value)
    step_phases = {name: sum(values) / len(values) for name, values in timers.items()}
    saves = saves_of(recorded.listing, dict(parsed.series(SAVE_KEY)))
    phases: list[Phase] = []

    created = epoch((recorded.cluster or {}).get("createTime", ""))
    nodes = _nodes(recorded.nodes or {})
    ready = [r for _c, r in nodes if r is not None]
    if created is not None:
        end = max(ready) if ready and len(ready) == len(nodes) else None
        phases.append(Phase("cluster and GPU nodes", end - created if end else None, created,
                            source="GKE createTime to the last GPU node Ready"))
    if nodes and ready and len(ready) == len(nodes):
        first = min(c for c, _r in nodes)
        phases.append(Phase("GPU nodes", max(ready) - first, first, source="first GPU node created to the last Ready"))
    images = pulls(recorded.events or {})
    if images:
        image, seconds, size, when = max(images, key=lambda p: p[1])
        phases.append(Phase("image pull", seconds, when - seconds if when else None, size,
                            source=f"kubelet Pulled event of {image}"))
    staged = sum(int(size) for marker in recorded.staged for size in (marker.get("files") or {}).values()) or None
    if recorded.staging is not None or staged:
        status = (recorded.staging or {}).get("status") or {}
        begin, done = epoch(status.get("startTime", "")), epoch(status.get("completionTime", ""))
        phases.append(Phase("staging", done - begin if begin and done else None, begin, staged,
                            source="the staging Job's startTime to completionTime; bytes from its markers"))
    if recorded.ray_cluster is not None:
        begin = epoch((recorded.ray_cluster.get("metadata") or {}).get("creationTimestamp", ""))
        ready = next((epoch(c.get("lastTransitionTime", ""))
                      for c in (recorded.ray_cluster.get("status") or {}).get("conditions") or []
                      if c.get("type") == "RayClusterProvisioned" and c.get("status") == "True"), None)
        phases.append(Phase("RayCluster ready", ready - begin if begin and ready else None, begin,
                            source="the RayCluster created to RayClusterProvisioned (KubeRay)"))

    events = timeline_events(recorded.timeline)
    starts = [e["at"] for e in events if e.get("event") == "job-start"]
    ends = [e["at"] for e in events if e.get("event") == "job-end"]
    seen = {e["step"]: e["at"] for e in events if e.get("event") == "step" and isinstance(e.get("step"), int)}
    rates: dict[str, float] = {}
    if starts and steps and steps[0][0] in seen:
        first_step, first_s = steps[0]
        startup = seen[first_step] - first_s - min(starts)
        phases.append(Phase("verl start-up", max(0.0, startup), min(starts),
                            source="job start to its first step's start (the step seen at most 60 s late)"))
        rates["verlStartupSeconds"] = round(max(0.0, startup), 1)
    if steps:
        mean = sum(s for _n, s in steps) / len(steps)
        phases.append(Phase("step", mean, source=f"mean of verl's {key} over {len(steps)} steps"))
        rates["stepSeconds"] = round(mean, 1)
    local = [s for s in saves if s.local_s and s.rank_bytes]
    if local:
        seconds = sum(s.local_s or 0.0 for s in local) / len(local)
        phases.append(Phase("checkpoint local save", seconds, bytes=local[-1].bytes,
                            source=f"verl's {SAVE_KEY}, mean of {len(local)} saves"))
        rates["localSaveGBpsPerRank"] = round(sum(s.rank_bytes / (s.local_s or 1.0) for s in local) / len(local) / 1e9, 2)
    copied = [s for s in saves if s.copy_s]
    if copied:
        seconds = sum(s.copy_s or 0.0 for s in copied) / len(copied)
        phases.append(Phase("checkpoint bucket copy", seconds, bytes=copied[-1].bytes,
                            source=f"saved.json to the last file in the bucket, mean of {len(copied)} saves"))
        rates["bucketWriteGBps"] = round(
            sum(s.bytes / s.nodes / (s.copy_s or 1.0) for s in copied) / len(copied) / 1e9, 2)
    if starts and ends:
        phases.append(Phase("run", max(ends) - min(starts), min(starts),
                            source="the first attempt's job start to the last one's end (the head's clock)"))
    if recorded.export_s:
        done = _decision_stamp(recorded.decisions, "model export ended")
        phases.append(Phase("export", recorded.export_s, done - recorded.export_s if done is not None else None,
                            source="the record's export_s"))
    ended = _decision_stamp(recorded.decisions, " run ended: ")
    released = _decision_stamp(recorded.decisions, " GPU workers released")
    if ended is not None and released is not None:
        phases.append(Phase("release", released - ended, ended, source="decisions 'run ended' to 'GPU workers released'"))
    return Measured(recorded.run_id, tuple(phases), steps, step_phases, saves, rates)
