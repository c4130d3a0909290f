"""Rates a real run measured, which replace the models' assumed ones: `measured/<stack>.json` in the project.

`verl-gke report --save` writes the file; synth and `pulumi up` read it here. Every rate is optional: a
rate the file lacks stays assumed. A malformed file is one line naming the file and the key.

    {"run": "<run id>", "stack": "<stack>", "measuredAt": "<RFC3339>",
     "rates": {"modelLoadGBps": 1.2, "localSaveGBpsPerRank": 2.1, "bucketWriteGBps": 1.8,
               "verlStartupSeconds": 300.0, "stepSeconds": 120.5}}
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PositiveFloat, ValidationError
from pydantic.alias_generators import to_camel

MEASURED_DIR = "measured"
"""The project folder's subfolder of measured rates, one file a stack."""


class MeasuredError(ValueError):
    """One line: the file, the key and what is wrong."""


class Rates(BaseModel):
    """What one run measured; None: not measured, the assumed rate stays."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    model_load_gbps: PositiveFloat | None = Field(None, alias="modelLoadGBps")
    """GB/s rank 0 read the model through GCS FUSE (domain/run_time.py MODEL_LOAD_GBPS)."""
    local_save_gbps_per_rank: PositiveFloat | None = Field(None, alias="localSaveGBpsPerRank")
    """A rank's local checkpoint write (domain/checkpoint_time.py SAVE_GBPS_PER_RANK)."""
    bucket_write_gbps: PositiveFloat | None = Field(None, alias="bucketWriteGBps")
    """A node's copy to the bucket (domain/checkpoint_time.py BUCKET_WRITE_GBPS)."""
    verl_startup_seconds: PositiveFloat | None = None
    """From the job RUNNING to verl's first training step (domain/run_time.py's start-up)."""
    step_seconds: PositiveFloat | None = None
    """A training step, the mean of the run's (domain/run_time.py's step)."""


class Measured(BaseModel):
    """One run's measured rates, for its stack."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    run: str = Field(min_length=1)
    stack: str = Field(min_length=1)
    measured_at: AwareDatetime
    rates: Rates

    @property
    def note(self) -> str:
        """What the output says beside every figure the run replaced."""
        return f"measured on run {self.run}"


def path_of(project_dir: Path, stack: str) -> Path:
    return project_dir / MEASURED_DIR / f"{stack}.json"


def load(project_dir: Path, stack: str) -> Measured | None:
    """The stack's measured rates; None when no run measured them. MeasuredError (one line) when the file is
    malformed or another stack's."""
    path = path_of(project_dir, stack)
    shown = f"{MEASURED_DIR}/{stack}.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise MeasuredError(f"{shown}: cannot be read ({error.strerror or error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise MeasuredError(f"{shown}: not JSON ({error.msg} at line {error.lineno})") from None
    try:
        measured = Measured.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(the whole file)"
        value = f" = {json.dumps(first['input'])[:60]}" if first["type"] != "missing" else ""
        raise MeasuredError(f"{shown}: {key}{value}: {_reason(first)}") from None
    if measured.stack != stack:
        raise MeasuredError(f"{shown}: stack = {json.dumps(measured.stack)}: measured on another stack; "
                            f"the file of stack {stack} holds its own runs only")
    return measured


def _reason(error: dict) -> str:
    kind = error["type"]
    if kind == "missing":
        return "missing"
    if kind == "extra_forbidden":
        return ("unknown key; rates are modelLoadGBps, localSaveGBpsPerRank, bucketWriteGBps, verlStartupSeconds, "
                "stepSeconds")
    if kind in ("datetime_from_date_parsing", "datetime_parsing", "datetime_type", "timezone_aware"):
        return "an RFC 3339 time with its offset, such as 2026-12-07T12:00:00Z"
    if kind in ("greater_than", "float_parsing", "float_type", "finite_number"):
        return "a number greater than 0"
    return str(error["msg"]).lower()

