"""Which run a Ray submission is: ids derived from the run's spec, so `pulumi up` twice never starts two."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SUBMISSION_ID_PREFIX = "verl-grpo"


def submission_id(stack: str, entrypoint: str, runtime_env: Mapping[str, Any], attempt: int, retry: int = 0) -> str:
    """`verl-grpo-<stack>-<12 hex>` of the run's spec, its attempt (jobAttempt) and the run
    supervisor's retry of that attempt; a new jobAttempt never meets an earlier attempt's retries."""
    job: dict[str, Any] = {"entrypoint": entrypoint, "runtime_env": whole_numbers(dict(runtime_env))}
    if attempt:
        job["attempt"] = attempt
    if retry:
        job["retry"] = retry
    canonical = json.dumps(job, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{SUBMISSION_ID_PREFIX}-{stack}-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def submission_ids(stack: str, entrypoint: str, runtime_env: Mapping[str, Any], attempt: int,
                   count: int) -> list[str]:
    """The ids of `attempt` and its first count - 1 retries: `pulumi up` submits the first, the run
    supervisor the others."""
    return [submission_id(stack, entrypoint, runtime_env, attempt, retry) for retry in range(count)]


def whole_numbers(value: Any) -> Any:
    """Integral floats become ints, recursively: the engine sends every number as a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [whole_numbers(item) for item in value]
    return value
