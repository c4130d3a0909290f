"""The stack outputs the CLI and CI read, typed.

They come from `pulumi stack output --json` when the Pulumi CLI is on PATH, or from a JSON file
of the same shape (`dist/<stack>/outputs.json` from `make synth`, or a saved
`pulumi stack output --json`). Never `--show-secrets`: the CLI needs no secret output, and a
secret shows up here as the string "[secret]".
"""

from __future__ import annotations

import base64
import binascii
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests.ray_cluster import ray_cluster_of
from verl_gke.commands import run_tool

SECRET_MASK = "[secret]"
UNKNOWN_MARK = "[unknown]"
"""How `make synth` writes an output whose value only a real deployment knows."""
PULUMI_TIMEOUT_S = 120.0

# output name -> kind; every one of these must be present.
_REQUIRED: dict[str, type] = {
    "clusterName": str,
    "clusterLocation": str,
    "namespace": str,
    "rayHeadService": str,
    "grpoSubmissionId": str,
    "grpoJobStatus": str,
    "dashboardCommand": str,
    "checkpointUri": str,
    "gpuPlatform": str,
    "gpuNodes": int,
    "gpusPerNode": int,
}
# Only needed to open a port-forward; `--dashboard-url` does without them.
_OPTIONAL: tuple[str, ...] = ("clusterEndpoint", "clusterCaCertificate")
# Informational: the live status comes from the head, so a synth's "[unknown]" is fine.
_MAY_BE_UNKNOWN: tuple[str, ...] = ("grpoJobStatus",)


class OutputsError(Exception):
    """Stack outputs that cannot be read or lack a key; the message is one line for the user."""


@dataclass(frozen=True)
class StackOutputs:
    """What the CLI needs to know about a deployed stack."""

    source: str
    """Where these came from (a file path or `pulumi stack output`), for messages."""
    cluster_name: str
    cluster_location: str
    namespace: str
    ray_head_service: str
    grpo_submission_id: str
    grpo_job_status: str | None
    """The job status when Pulumi last read it (None before deployment); the live one comes from the Ray head."""
    dashboard_command: str
    checkpoint_uri: str
    gpu_platform: str
    gpu_nodes: int
    gpus_per_node: int
    cluster_endpoint: str | None
    cluster_ca_certificate: str | None
    fabric_busbw_gbps: float | None = None
    """The fabric check's figure when the job was created (None: not measured, or not deployed)."""
    preflight_checks: tuple[str, ...] = ()
    """What the preview checked against the live project."""
    hourly_cost_usd: float | None = None
    """The stack's price per hour from the pinned price table (None: unknown, or an older stack)."""
    run_id: str = ""
    """The stack's run (`runId`); an older stack's is the last folder of its checkpointUri."""
    run_record: str = ""
    """The run record ConfigMap `<rayClusterName>-run-<12 hex>` (`runRecord`; '' on an older stack)."""
    bucket_name: str = ""
    """The training bucket (`bucketName`): where `logs/<run id>/` outlives the cluster."""
    modeled_step_s: float | None = None
    """The run's modeled step (`modeledStepSeconds`, domain/run_time.py); None: not modeled, or an older stack."""
    modeled_run_s: float | None = None
    """The run's modeled time, steps and checkpoints (`modeledRunSeconds`); None: not modeled, or steps unknown."""
    modeled_verl_startup_s: float | None = None
    """verl's modeled start-up once the job runs (`modeledVerlStartupSeconds`); None: not modeled, or older."""

    def run_checkpoint_uri(self, run_id: str) -> str:
        """Where `run_id`'s checkpoints are: checkpointUri is `<verl.trainer.default_local_dir>/<the stack's
        run id>`, and each run has its folder beside it."""
        return f"{self.checkpoint_uri.rstrip('/').removesuffix(f'/{self.run_id}')}/{run_id}"

    @property
    def ray_cluster(self) -> str:
        """The RayCluster the run records belong to."""
        return self.run_record.rsplit("-run-", 1)[0] if self.run_record else ray_cluster_of(self.ray_head_service)

    @property
    def offline(self) -> bool:
        """From `make synth`: its cluster CA is a stand-in, not the PEM certificate of a real cluster."""
        if self.cluster_ca_certificate is None:
            return False
        try:
            pem = base64.b64decode(self.cluster_ca_certificate, validate=True)
        except (binascii.Error, ValueError):
            return True
        return not pem.lstrip().startswith(b"-----BEGIN CERTIFICATE-----")


def load(outputs_file: Path | None, stack: str | None = None) -> StackOutputs:
    """Reads `outputs_file` when given, else asks the Pulumi CLI for `stack` (or the selected stack)."""
    if outputs_file is not None:
        return from_file(outputs_file)
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise OutputsError(
            "no stack outputs: the pulumi CLI is not on PATH; pass --outputs FILE "
            "(a saved `pulumi stack output --json`, or dist/<stack>/outputs.json from `make synth`)"
        )
    command = [pulumi, "stack", "output", "--json", *(["--stack", stack] if stack else [])]
    source = " ".join(["pulumi stack output --json", *(["--stack", stack] if stack else [])])
    return from_text(run_tool(command, source, PULUMI_TIMEOUT_S, OutputsError), source)


def from_file(path: Path) -> StackOutputs:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OutputsError(f"stack outputs file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise OutputsError(f"cannot read stack outputs file {path}: {error}") from None
    return from_text(text, str(path))


def from_text(text: str, source: str) -> StackOutputs:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise OutputsError(
            f"{source} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    return from_mapping(data, source)


def from_mapping(data: Any, source: str) -> StackOutputs:
    """Checks every key and kind; the first problem found becomes the error."""
    if not isinstance(data, dict):
        raise OutputsError(f"{source} must hold a JSON object of stack outputs, not {type(data).__name__}")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise OutputsError(
            f"{source} lacks stack output{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(is it from `pulumi stack output --json` of a verl-gke stack?)"
        )
    values: dict[str, Any] = {}
    for key, kind in _REQUIRED.items():
        if key in _MAY_BE_UNKNOWN and data[key] == UNKNOWN_MARK:
            values[key] = None
        else:
            values[key] = _int(data[key], key, source) if kind is int else _str(data[key], key, source)
    for key in _OPTIONAL:
        raw = data.get(key)
        values[key] = None if raw in (None, "", SECRET_MASK, UNKNOWN_MARK) else _str(raw, key, source)
    return StackOutputs(
        source=source,
        cluster_name=values["clusterName"],
        cluster_location=values["clusterLocation"],
        namespace=values["namespace"],
        ray_head_service=values["rayHeadService"],
        grpo_submission_id=values["grpoSubmissionId"],
        grpo_job_status=values["grpoJobStatus"],
        dashboard_command=values["dashboardCommand"],
        checkpoint_uri=values["checkpointUri"],
        gpu_platform=values["gpuPlatform"],
        gpu_nodes=values["gpuNodes"],
        gpus_per_node=values["gpusPerNode"],
        cluster_endpoint=values["clusterEndpoint"],
        cluster_ca_certificate=values["clusterCaCertificate"],
        fabric_busbw_gbps=_figure(data.get("fabricBusBandwidthGbps")),
        preflight_checks=tuple(str(line) for line in data.get("preflightChecks") or [] if isinstance(line, str)),
        hourly_cost_usd=_figure(data.get("hourlyCostUsd")),
        # `<verl.trainer.default_local_dir>/<run id>` names the run on a stack older than `runId`.
        run_id=_text(data.get("runId")) or values["checkpointUri"].rstrip("/").rsplit("/", 1)[-1],
        run_record=_text(data.get("runRecord")),
        bucket_name=_text(data.get("bucketName")),
        modeled_step_s=_figure(data.get("modeledStepSeconds")),
        modeled_run_s=_figure(data.get("modeledRunSeconds")),
        modeled_verl_startup_s=_figure(data.get("modeledVerlStartupSeconds")),
    )


def _text(value: Any) -> str:
    """An optional name: absent, masked or unknown is ''."""
    return value if isinstance(value, str) and value not in (SECRET_MASK, UNKNOWN_MARK) else ""


def _figure(value: Any) -> float | None:
    """An informational number: absent, null or "[unknown]" (a synth) is None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _str(value: Any, key: str, source: str) -> str:
    if value == SECRET_MASK:
        raise OutputsError(f"stack output {key} in {source} is a secret; it must be exported in clear")
    if value == UNKNOWN_MARK:
        raise OutputsError(f"stack output {key} in {source} is not known before deployment; "
                           "use the outputs of a deployed stack (`pulumi stack output --json`)")
    if not isinstance(value, str) or not value:
        raise OutputsError(f"stack output {key} in {source} must be a non-empty string, got {value!r}")
    return value


def _int(value: Any, key: str, source: str) -> int:
    # JSON from Pulumi's engine may carry whole numbers as floats (2.0).
    whole = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())
    if not whole or value < 0:
        raise OutputsError(f"stack output {key} in {source} must be a whole number >= 0, got {value!r}")
    return int(value)
