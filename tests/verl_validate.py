"""Runs verl's own validate_config on composed runs; a child process of tests/test_verl_config.py.

Run with PYTHONPATH set to an unpacked verl wheel (domain.verl_wheel.unpacked): importing verl
needs torch, which the program itself never loads. Reads {"config_dir": ..., "runs": [[override,
...], ...]} on stdin; prints a JSON list with, per run, null when verl accepts it or verl's error.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings


def validate(config_dir: str, args: list[str]) -> str | None:
    from hydra import compose, initialize_config_dir

    from verl.trainer.ppo.utils import need_critic
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=args)
    # As main_ppo: the reference worker exists only with a KL loss or in-reward KL.
    use_reference_policy = bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate_config(config, use_reference_policy=use_reference_policy, use_critic=need_critic(config))
    except (AssertionError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def main() -> None:
    request = json.load(sys.stdin)
    # verl prints notices on stdout: keep stdout for the answer alone.
    with contextlib.redirect_stdout(sys.stderr):
        results = [validate(request["config_dir"], run) for run in request["runs"]]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
