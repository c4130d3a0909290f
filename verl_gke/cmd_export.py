"""`verl-gke export`: verl's model merger on the head as a Ray job (workloads/export_model.py): a
checkpoint of the run becomes a Hugging Face model in the bucket."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from access.log_text import inert
from verl_gke import reach
from verl_gke.console import CliError, TimedOut, positive_float, progress


def add_parser(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    exp = subparsers.add_parser(
        "export", parents=parents, help="merge a checkpoint into a Hugging Face model in the bucket",
        description="Run verl's model merger on the head as a Ray job: the checkpoint at --step (default: the "
                    "newest) becomes safetensors at gs://<bucket>/models/<run>/model (or model-step-N), which "
                    "transformers and vLLM load. Waits for the job and prints the model's gs:// URI.")
    exp.add_argument("--step", type=int, metavar="N", help="checkpoint step (default: the newest)")
    exp.add_argument("--memory-gb", type=positive_float, metavar="GB",
                     help="memory the merge needs (about 8 bytes per parameter); Ray then runs it on a node with "
                          "that much free instead of the head")
    exp.add_argument("--timeout", type=positive_float, default=4 * 3600.0, metavar="S",
                     help="give up waiting after S seconds (default 14400)")
    exp.add_argument("--bucket-mount", default="/data", metavar="PATH",
                     help="where the Ray nodes mount the bucket (default /data)")
    exp.add_argument("--verl-dir", metavar="PATH", help="a verl on the nodes to merge with (default: the head's)")
    exp.add_argument("--python", default="python", help="Python on the node with verl's dependencies (default python)")
    exp.add_argument("--poll", type=positive_float, default=reach.DEFAULT_POLL_S, metavar="S",
                     help=f"seconds between status checks (default {reach.DEFAULT_POLL_S:g})")
    exp.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from workloads import export_model

    target = reach.target(args, need_outputs=True)
    outputs = target.outputs
    assert outputs is not None
    # The run's folder and model, named by the run (as the supervisor's export does), never by a Ray job.
    run_id = target.run.run_id if target.run is not None else outputs.run_id or target.submission_id
    checkpoints = outputs.run_checkpoint_uri(run_id)
    bucket, _, folder = checkpoints.removeprefix("gs://").partition("/")
    if not checkpoints.startswith("gs://") or not folder:
        raise CliError(f"{outputs.source}: checkpointUri {outputs.checkpoint_uri!r} is not gs://<bucket>/<path>")

    def job(id_suffix: str = "") -> dict:
        return export_model.submission(
            run_id=run_id, checkpoint_dir=f"{args.bucket_mount}/{folder}", step=args.step,
            working_dir=str(Path(export_model.__file__).parent),
            memory_bytes=int(args.memory_gb * 1e9) if args.memory_gb else None, mount=args.bucket_mount,
            verl_dir=args.verl_dir, python=args.python, bucket=bucket, id_suffix=id_suffix)

    kwargs = job()
    uri = f"gs://{bucket}/{export_model.model_path(run_id, args.step)}"
    with reach.head(args, outputs) as url:
        client = reach.job_client(url)
        known = reach.ray_call(url, "listing jobs",
                               lambda: {str(j.submission_id): str(j.status) for j in client.list_jobs()})
        # An ended export of this id is an earlier command's, not this one's outcome: a new id (Ray refuses an id
        # twice); a live one is followed. The export's claim refuses it while another export of the run is live.
        again = 1
        while known.get(kwargs["submission_id"]) in reach.TERMINAL_STATUSES:
            again += 1
            kwargs = job(f"-re{again}")
        if kwargs["submission_id"] not in known:
            reach.ray_call(url, "submitting the export", lambda: client.submit_job(**kwargs))
        progress(f"export {kwargs['submission_id']}: verl's merger into {uri}")
        deadline = time.monotonic() + args.timeout
        while (status := str(reach.ray_call(url, "reading the export",
                                            lambda: client.get_job_status(kwargs["submission_id"])))) \
                not in reach.TERMINAL_STATUSES:
            if time.monotonic() > deadline:
                raise TimedOut(f"export {kwargs['submission_id']} still {status} after {args.timeout:g} s")
            time.sleep(args.poll)
        if status != "SUCCEEDED":
            logs = reach.ray_call(url, "reading the export's logs",
                                  lambda: client.get_job_logs(kwargs["submission_id"]))
            tail = " | ".join(inert(logs).strip().splitlines()[-3:])
            raise CliError(f"export {kwargs['submission_id']} {status}: {tail}")
    print(uri)
    return 0
