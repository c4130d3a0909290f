"""The preflight through the engine: the domain's checks answered by the gcp provider's invokes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulumi

from domain.config import ConfigError, StackConfig
from domain.preflight import PreflightResult, run_preflight
from workloads.gcs import STORAGE_URL, Gcs


def engine_invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
    """An invoke through the engine (the gcp provider, with the user's credentials at preview)."""
    from pulumi.runtime import invoke

    return dict(invoke(token, {k: v for k, v in args.items() if v is not None}).value or {})


CLIENT_CONFIG = "gcp:organizations/getClientConfig:getClientConfig"
"""The gcp provider's own credentials (`accessToken`): the user's, at preview; never stored in the state."""
READ_TIMEOUT_S = 30


def open_gcs_object(bucket: str, name: str, generation: int, *, root: str = STORAGE_URL,
                    token: str | None = None) -> tuple[int, Callable[[int, int], bytes]]:
    """One generation of an object through the GCS JSON API: its size (objects.get) and ranged media reads
    (`token`: the provider's when None)."""
    token = token or engine_invoke(CLIENT_CONFIG, {}).get("accessToken")
    if not token:
        raise RuntimeError("the gcp provider gave no access token (offline, or no credentials)")
    gcs = Gcs(bucket, storage_url=root, token_url=None, access_token=token, timeout_s=READ_TIMEOUT_S)
    stat = gcs.stat(name, generation)
    if stat is None:
        raise FileNotFoundError(f"gs://{bucket}/{name} has no generation {generation}")

    def read(start: int, length: int) -> bytes:
        data = gcs.media(name, generation, start, length)
        if data is None:
            raise FileNotFoundError(f"gs://{bucket}/{name} has no generation {generation} any more")
        return data

    return stat.size, read


def check_live_project(cfg: StackConfig) -> PreflightResult:
    """Run the preflight through the engine; stop the program on any problem, log what was checked."""
    result = run_preflight(cfg, engine_invoke, pulumi.get_stack(), open_gcs_object)
    if result.problems:
        source = f"Pulumi.{pulumi.get_stack()}.yaml, checked against project {cfg.project},"
        raise pulumi.RunError(str(ConfigError(result.problems, source)))
    for note in result.notes:
        pulumi.log.info(f"preflight: {note}")
    return result
