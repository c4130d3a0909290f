"""The preflight through the engine: the domain's checks answered by the gcp provider's invokes."""

from __future__ import annotations

from typing import Any

import pulumi

from domain.config import ConfigError, StackConfig
from domain.preflight import PreflightResult, run_preflight


def engine_invoke(token: str, args: dict[str, Any]) -> dict[str, Any]:
    """An invoke through the engine (the gcp provider, with the user's credentials at preview)."""
    from pulumi.runtime import invoke

    return dict(invoke(token, {k: v for k, v in args.items() if v is not None}).value or {})


def check_live_project(cfg: StackConfig) -> PreflightResult:
    """Run the preflight through the engine; stop the program on any problem, log what was checked."""
    result = run_preflight(cfg, engine_invoke, pulumi.get_stack())
    if result.problems:
        source = f"Pulumi.{pulumi.get_stack()}.yaml, checked against project {cfg.project},"
        raise pulumi.RunError(str(ConfigError(result.problems, source)))
    for note in result.notes:
        pulumi.log.info(f"preflight: {note}")
    return result
