"""The running stack's config, read from the Pulumi engine and checked by the domain's rules."""

from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config
from pulumi.runtime import mocks, settings

from domain.config import (
    ConfigError, StackConfig, config_warnings, load_config, placeholders,
)
from domain.measured import MeasuredError
from domain.measured import load as load_measured
from domain.run_time import RunTime
from domain.stack_files import PROJECT_DIR
from domain.verl_config import verl_run_check


def from_pulumi(allow_placeholders: bool | None = None) -> tuple[StackConfig, RunTime | None]:
    """The running stack's config (the Hugging Face token is not config: it is in Secret Manager), and its run's
    modeled step and run time (None: the model or the platform is outside domain/run_time.py's model).

    Stops the program without a traceback on any problem. Placeholders are allowed only
    under the offline mock engine (synth, tests) unless said otherwise; a real `pulumi up`
    (or preview) stops at once with their list.
    """
    source = f"Pulumi.{pulumi.get_stack()}.yaml"
    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret_keys = [key for key in raw if runtime_config.is_config_secret(key)]
    secret_keys += runtime_config.get_config_secret_keys_env()
    try:
        cfg = load_config(raw, source, secret_keys)
    except ConfigError as error:
        raise pulumi.RunError(str(error)) from None
    for warning in config_warnings(raw):
        pulumi.log.warn(warning)
    try:
        measured = load_measured(PROJECT_DIR, pulumi.get_stack())
    except MeasuredError as error:
        raise pulumi.RunError(str(error)) from None
    problems, plan = verl_run_check(cfg, measured)
    if problems:
        raise pulumi.RunError(str(ConfigError(problems, source)))
    if plan is not None:
        for line in plan.lines():
            pulumi.log.info(line)
        for warning in plan.warnings:
            pulumi.log.warn(warning)
    missing = placeholders(raw, cfg)
    if allow_placeholders is None:
        allow_placeholders = isinstance(settings.get_monitor(), mocks.MockMonitor)
    if missing and not allow_placeholders:
        raise pulumi.RunError(f"{source} still has placeholders; set them before `pulumi up`:\n"
                              + "\n".join(f"  {key}" for key in missing))
    return cfg, plan.time if plan is not None else None
