"""`verl-gke report`: the run measured (verl_gke/measured.py) against what synth modeled, phase by phase,
with the ratio; a PNG of the same; `--save` writes the measured rates to measured/<stack>.json, which synth
reads in place of its assumed ones.

The model is the stack's: its outputs (modeledStepSeconds, modeledRunSeconds) and the named assumptions of
domain/ (deploy durations, checkpoint rates). A run other than the stack's own is shown measured only.
Exit: 0 shown, 1 the command failed, EXIT_NEVER_STARTED (9) the run never started (or nothing is deployed).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.checkpoint_time import BUCKET_WRITE_GBPS, SAVE_GBPS_PER_RANK
from domain.deploy_timing import CLUSTER
from domain.staged import MARKER_NAME
from domain.platforms import (
    AUTOPILOT_GPU_NODES,
    DEPLOY_DURATIONS,
    GPU_POOL_CREATE,
    RAY_PODS_FROM_DOCKER_HUB,
    RAY_PODS_STREAMED,
)
from verl_gke import gke_facts, stack_outputs
from verl_gke.commands import run_tool
from verl_gke.console import CliError, one_line, progress
from verl_gke.measured import Measured, Recorded, measure, pulls
from verl_gke.stack_outputs import StackOutputs
from verl_gke.verify import gcloud_json, nothing_deployed, storage_ls
from workloads.run_logs import DECISIONS_FILE, RECORD_FILE, TIMELINE_FILE, attempt_file
from workloads.run_record import RunRecord

EXIT_NEVER_STARTED = 9
SUPERVISOR_STEP_S = 15.0
"""The release comes within one supervisor step of the outcome (docs/architecture.md)."""
STAGING_JOB = "kubernetes:batch/v1:Job"
STAGING_SELECTOR = "app.kubernetes.io/component%3Ddata-staging"
GCLOUD_TIMEOUT_S = 120.0
MARKERS_READ = 4
"""The model, the dataset and verl: a bucket holding more (earlier models) adds at most one more read."""
KUBE_TIMEOUT_S = 30.0
PNG_SIZE = (12.0, 7.0)
PNG_DPI = 100
RATE_NAMES = ("modelLoadGBps", "localSaveGBpsPerRank", "bucketWriteGBps", "verlStartupSeconds", "stepSeconds")
"""The keys of measured/<stack>.json's rates, in order (synth reads them)."""


class NeverStarted(CliError):
    exit_code = EXIT_NEVER_STARTED


@dataclass(frozen=True)
class Row:
    phase: str
    modeled_s: float | None
    measured_s: float | None
    bytes: int | None
    source: str

    @property
    def ratio(self) -> float | None:
        return self.measured_s / self.modeled_s if self.measured_s is not None and self.modeled_s else None


def modeled(phase: str, measured: Measured, outputs: StackOutputs, autopilot: bool, image: str) -> float | None:
    """What the stack's model says `phase` takes (None: not modeled). A save's model is the assumed rate
    applied to the bytes the run really saved."""
    save = next((s for s in reversed(measured.saves) if s.rank_bytes), None)
    nodes_s = (AUTOPILOT_GPU_NODES if autopilot else GPU_POOL_CREATE).seconds
    table: dict[str, float | None] = {
        "cluster and GPU nodes": DEPLOY_DURATIONS[CLUSTER].seconds + nodes_s,
        "GPU nodes": nodes_s,
        "image pull": (RAY_PODS_STREAMED if "-docker.pkg.dev/" in image else RAY_PODS_FROM_DOCKER_HUB).seconds,
        "staging": DEPLOY_DURATIONS[STAGING_JOB].seconds,
        "RayCluster ready": (RAY_PODS_STREAMED if "-docker.pkg.dev/" in image else RAY_PODS_FROM_DOCKER_HUB).seconds,
        "verl start-up": outputs.modeled_verl_startup_s,
        "step": outputs.modeled_step_s,
        "checkpoint local save": save.rank_bytes / (SAVE_GBPS_PER_RANK * 1e9) if save else None,
        "checkpoint bucket copy": save.bytes / save.nodes / (BUCKET_WRITE_GBPS * 1e9) if save else None,
        "run": outputs.modeled_run_s,
        "release": SUPERVISOR_STEP_S,
    }
    return table.get(phase)


def rows(measured: Measured, outputs: StackOutputs | None, autopilot: bool = False,
         image: str = "") -> list[Row]:
    """One row per measured phase; modeled only against the stack's own run (`outputs` None: not compared)."""
    return [Row(p.name, modeled(p.name, measured, outputs, autopilot, image) if outputs else None, p.seconds,
                p.bytes, p.source) for p in measured.phases]


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 60:.1f} min" if value >= 600 else f"{value:.1f} s"


def text(measured: Measured, table: Sequence[Row], compared: str) -> list[str]:
    """The report's lines: a header, the table, verl's timers, the rates."""
    out = [f"Run {measured.run_id}: {compared}"]
    cells = [("phase", "modeled", "measured", "ratio", "bytes", "measured from")]
    cells += [(r.phase, _seconds(r.modeled_s), _seconds(r.measured_s), f"{r.ratio:.2f}x" if r.ratio else "-",
               f"{r.bytes / 1e9:.1f} GB" if r.bytes else "-", r.source) for r in table]
    widths = [max(len(row[i]) for row in cells) for i in range(5)]
    out += ["  ".join([*(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row[:5], widths))),
                       row[5]]).rstrip() for row in cells]
    for save in measured.saves:
        local = f"local save {save.local_s:.1f} s ({save.rank_bytes / save.local_s / 1e9:.2f} GB/s per rank)" \
            if save.local_s and save.rank_bytes else "local save not timed"
        copy = f"bucket copy {save.copy_s:.1f} s ({save.bytes / save.nodes / save.copy_s / 1e9:.2f} GB/s per node, " \
               f"{save.nodes} node{'s' * (save.nodes != 1)})" if save.copy_s else "bucket copy not timed"
        out.append(f"checkpoint step {save.step}: {save.bytes / 1e9:.1f} GB, {local}, {copy}")
    if measured.step_phases:
        out.append("verl's timers per step (mean): " + ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in measured.step_phases.items()))
    if measured.rates:
        out.append("measured rates: " + ", ".join(f"{k} {measured.rates[k]:g}" for k in RATE_NAMES
                                                  if k in measured.rates))
    return out


def draw(measured: Measured, table: Sequence[Row], modeled_step_s: float | None, path: Path) -> None:
    """A PNG: modeled and measured bars per phase on one time axis, and step time per step."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=PNG_SIZE, dpi=PNG_DPI)
    FigureCanvasAgg(figure)
    bars, steps = figure.subplots(2, 1, gridspec_kw={"height_ratios": [3, 2]})
    origin = min((p.start for p in measured.phases if p.start is not None), default=0.0)
    names = [r.phase for r in table]
    for y, (row, phase) in enumerate(zip(table, measured.phases)):
        # Both bars of a phase start where it was measured to start: their lengths compare.
        left = (phase.start - origin) / 60 if phase.start is not None else 0.0
        if row.modeled_s:
            bars.barh(y - 0.2, row.modeled_s / 60, left=left, height=0.4, color="tab:gray",
                      label="_" if any(r.modeled_s for r in table[:y]) else "modeled")
        if row.measured_s is not None:
            bars.barh(y + 0.2, row.measured_s / 60, left=left, height=0.4, color="tab:blue",
                      label="_" if any(r.measured_s is not None for r in table[:y]) else "measured")
    bars.set_yticks(range(len(names)), names)
    bars.invert_yaxis()
    bars.set_xlabel("minutes from the first measured start (a phase known only by its length starts at 0)")
    bars.set_title(f"Run {measured.run_id}: modeled and measured")
    bars.legend(loc="best")
    bars.grid(True, axis="x", alpha=0.3)
    if measured.steps:
        steps.plot([s for s, _ in measured.steps], [v for _, v in measured.steps], marker="o", label="measured")
    if modeled_step_s:
        steps.axhline(modeled_step_s, color="tab:gray", linestyle="--", label=f"modeled {modeled_step_s:.0f} s")
    steps.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps.set_xlabel("step")
    steps.set_ylabel("seconds per step")
    steps.grid(True, alpha=0.3)
    steps.legend(loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")


def saved(measured: Measured, stack: str, now: float) -> dict[str, Any]:
    """measured/<stack>.json: the measured rates only."""
    return {"run": measured.run_id, "stack": stack,
            "measuredAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "rates": {k: measured.rates[k] for k in RATE_NAMES if k in measured.rates}}


# --- reading what the run left ------------------------------------------------------------------


def recorded(run_id: str, read: Any, listing: str, live: dict[str, Any]) -> Recorded:
    """The run's records: the bucket copy (`read(name)`), the checkpoints' listing, and the live cluster's
    answers and staging's markers (`live`: cluster, nodes, events, staging, ray_cluster, staged)."""
    text = read(RECORD_FILE)
    record = RunRecord.from_json(text) if text else None
    logs = "".join(read(attempt_file(a.index)) or "" for a in record.attempts) if record else ""
    return Recorded(run_id=run_id, logs=logs, timeline=read(TIMELINE_FILE) or "",
                    decisions=read(DECISIONS_FILE) or "", export_s=record.export_s if record else None,
                    listing=listing, **live)


def _live(outputs: StackOutputs, args: argparse.Namespace) -> dict[str, Any]:
    """GKE's and the cluster's answers, each bounded; what cannot be read is left out (said on stderr)."""
    from access.cluster_api import cluster_api
    from workloads.kube import KubernetesApi

    live: dict[str, Any] = {}
    try:
        live["cluster"] = gcloud_json(["container", "clusters", "describe", outputs.cluster_name, "--location",
                                   outputs.cluster_location])
        if args.kube_api_url:
            api = KubernetesApi(args.kube_api_url, timeout_s=KUBE_TIMEOUT_S)
        else:
            found = gke_facts.describe(outputs.cluster_name, outputs.cluster_location)
            api = cluster_api(found.endpoint, found.ca_certificate, KUBE_TIMEOUT_S)
        ns = outputs.namespace
        live["nodes"] = api.request("GET", "/api/v1/nodes")
        live["events"] = api.request("GET", f"/api/v1/namespaces/{ns}/events")
        jobs = api.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs?labelSelector={STAGING_SELECTOR}") or {}
        live["staging"] = next(iter(jobs.get("items") or []), None)
        live["ray_cluster"] = api.request("GET", f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{outputs.ray_cluster}")
    except Exception as error:  # noqa: BLE001 - the cluster may be gone: the bucket's records remain
        progress(f"the live cluster was not read ({one_line(error)}): its phases are left out")
    try:
        markers = storage_ls([f"gs://{outputs.bucket_name}/**/{MARKER_NAME}"]).split()
        live["staged"] = tuple(json.loads(run_tool(["gcloud", "storage", "cat", url], f"gcloud storage cat {url}",
                                                   GCLOUD_TIMEOUT_S, CliError)) for url in markers[:MARKERS_READ])
    except Exception as error:  # noqa: BLE001 - the staging's bytes are left out
        progress(f"staging's markers were not read ({one_line(error)}): its bytes are left out")
    return live


def _listing(uri: str) -> str:
    try:
        return storage_ls(["-l", "-r", f"{uri.rstrip('/')}/**"])
    except Exception as error:  # noqa: BLE001 - the bucket's other records still make a report
        progress(f"the checkpoints were not listed ({one_line(error)}): their phases are left out")
        return ""


def _local_listing(root: Path, uri: str) -> str:
    """The checkpoints under a local copy of the bucket, listed as `gcloud storage ls -l -r` lists them."""
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    lines = []
    for path in sorted((root / prefix).rglob("*")):
        if path.is_file():
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(path.stat().st_mtime))
            lines.append(f"{path.stat().st_size:>12}  {stamp}  gs://{bucket}/{path.relative_to(root).as_posix()}")
    return "".join(f"{line}\n" for line in lines)


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`parents`: the CLI's shared flags report reads (verl_gke/cli.py COMMAND_FLAGS)."""
    parser = subparsers.add_parser(
        "report", parents=parents, help="the run measured against the model, phase by phase (text and PNG)",
        description="Read what the run recorded (its copy in the bucket: record, decisions, timeline, logs with "
                    "verl's timing metrics; the checkpoints' sizes and times; GKE's and the cluster's timestamps "
                    "while it stands) and print each phase modeled against measured with the ratio. A run other "
                    f"than the stack's own is shown measured only. Exit {EXIT_NEVER_STARTED}: the run never started.")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="write the timeline and step times as a PNG")
    parser.add_argument("--save", action="store_true",
                        help="write the measured rates to measured/<stack>.json (needs --stack), read by synth")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from verl_gke.runs import BucketCopy

    if args.save and not args.stack:
        raise CliError("report --save writes measured/<stack>.json: name the stack with --stack NAME")
    outputs = stack_outputs.load(args.outputs, args.stack)
    if why := nothing_deployed(outputs, "report"):
        raise NeverStarted(why)
    run_id = args.run or outputs.run_id
    copy = BucketCopy(run_id, outputs.bucket_name, Path(args.bucket_dir) if args.bucket_dir else None)
    own = run_id == outputs.run_id
    uri = outputs.run_checkpoint_uri(run_id)
    listing = _local_listing(Path(args.bucket_dir), uri) if args.bucket_dir else _listing(uri)
    found = recorded(run_id, copy.read, listing,
                     _live(outputs, args) if own and not args.bucket_dir else {})
    measured = measure(found)
    if not measured.started:
        raise NeverStarted(f"run {run_id} never started: nothing recorded in {copy.folder} (no record, timeline or "
                           "step), nor in the cluster")
    compared = "measured against the stack's model" if own else \
        f"measured only: not compared, the stack outputs model its run {outputs.run_id}, not {run_id}"
    image = next((p[0] for p in pulls(found.events or {})), "")
    autopilot = bool(((found.cluster or {}).get("autopilot") or {}).get("enabled"))
    table = rows(measured, outputs if own else None, autopilot, image)
    print("\n".join(text(measured, table, compared)))
    if args.plot:
        draw(measured, table, outputs.modeled_step_s if own else None, args.plot)
        progress(f"wrote {args.plot}")
    if args.save:
        path = Path("measured") / f"{args.stack}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved(measured, args.stack, time.time()), indent=2) + "\n", encoding="utf-8")
        progress(f"wrote {path}")
    return 0
