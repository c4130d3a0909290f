"""The preflight through the engine: the domain's checks answered by the gcp provider's invokes."""

from __future__ import annotations

import urllib.parse
import urllib.request
from typing import Any

import pulumi

from domain.config import ConfigError, StackConfig
from domain.preflight import PreflightResult, run_preflight


def engine_invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
    """An invoke through the engine (the gcp provider, with the user's credentials at preview)."""
    from pulumi.runtime import invoke

    return dict(invoke(token, {k: v for k, v in args.items() if v is not None}).value or {})


CLIENT_CONFIG = "gcp:organizations/getClientConfig:getClientConfig"
"""The gcp provider's own credentials (`accessToken`): the user's, at preview; never stored in the state."""
READ_TIMEOUT_S = 30


def gcs_tail(bucket: str, name: str, generation: int, n: int) -> bytes:
    """The last `n` bytes of one generation of an object (GCS JSON API media download with a suffix Range)."""
    token = engine_invoke(CLIENT_CONFIG, {})["accessToken"]
    url = (f"https://storage.googleapis.com/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
           f"{urllib.parse.quote(name, safe='')}?alt=media&generation={generation}")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Range": f"bytes=-{n}"})
    with urllib.request.urlopen(request, timeout=READ_TIMEOUT_S) as response:
        return response.read(n)


def check_live_project(cfg: StackConfig) -> PreflightResult:
    """Run the preflight through the engine; stop the program on any problem, log what was checked."""
    result = run_preflight(cfg, engine_invoke, pulumi.get_stack(), gcs_tail)
    if result.problems:
        source = f"Pulumi.{pulumi.get_stack()}.yaml, checked against project {cfg.project},"
        raise pulumi.RunError(str(ConfigError(result.problems, source)))
    for note in result.notes:
        pulumi.log.info(f"preflight: {note}")
    return result
