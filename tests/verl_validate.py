"""verl's own validate_config on composed runs: a fork server, one per pytest worker (tests/test_verl_config.py).

Each stdin line is a request {"verl": an unpacked wheel, "config_dir", "runs": [[override, ...], ...], "models":
{path: shape}, "vllm": {"source", "version"} or null}, models and vLLM served by stand-ins (tests/verl_standins.py);
each answer line is {"results": [...]}: per run null (accepted) or verl's error; with the V1 trainer, dynamic
sampling also meets the trainer's own check. The server imports verl's heavy dependencies once (torch; not verl or
vLLM: verl caches what it finds of vLLM) and forks a child per request with the request's verl where PYTHONPATH
would put it: a fresh interpreter's state, nothing a request leaves behind (verl's modules and caches, the
stand-ins on sys.meta_path) reaching the next.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import logging
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

from verl_standins import VllmStandIn, write_qwen2_model


def validate(config_dir: str, args: list[str]) -> str | None:
    from hydra import compose, initialize_config_dir
    from hydra.errors import InstantiationException

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
            if config.trainer.get("use_v1"):
                v1_sampling_check(config)
    except (AssertionError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    except InstantiationException as e:
        # verl builds a dataclass from a section (the critic's model: HFModelConfig loads the folder).
        key = str(e).rsplit("full_key: ", 1)[-1].strip()
        return f"InstantiationException at {key}: {type(e.__cause__).__name__}: {e.__cause__}"
    return None


def v1_sampling_check(config: object) -> None:
    """The V1 trainer's own check of dynamic sampling (TrainerBase._resolve_filter_groups_metric, run when it
    builds its replay buffer on the GPUs), compiled alone from the wheel's source: its module imports Ray,
    transfer_queue and the workers."""
    import verl

    source = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    tree = ast.parse(source.read_text())
    (method,) = [node for cls in tree.body if isinstance(cls, ast.ClassDef) for node in cls.body
                 if isinstance(node, ast.FunctionDef) and node.name == "_resolve_filter_groups_metric"]
    namespace: dict[str, object] = {"logger": logging.getLogger("verl.trainer.ppo.v1.trainer_base")}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(source), "exec"), namespace)
    namespace["_resolve_filter_groups_metric"](SimpleNamespace(config=config))  # type: ignore[operator]


# Imported once, before the forks: what importing verl's validators imports anyway (datasets: from verl 0.9.0 on),
# none of it looks for vLLM or verl.
WARM = ("torch", "transformers", "transformers.modeling_utils", "hydra", "omegaconf", "ray", "tensordict", "accelerate",
        "datasets")


def answer(request: dict) -> list[str | None]:
    sys.path.insert(1, request["verl"])  # after the script's folder, as PYTHONPATH
    with tempfile.TemporaryDirectory(prefix="verl-standins-") as tmp:
        folders = {}
        for i, (path, shape) in enumerate(request.get("models", {}).items()):
            folders[path] = Path(tmp) / f"model-{i}"
            write_qwen2_model(folders[path], shape)
        if request.get("vllm"):
            VllmStandIn(Path(request["vllm"]["source"]), request["vllm"]["version"], Path(tmp) / "site")
        runs = [[f"{k}={folders[v]}" if v in folders else f"{k}={v}" for k, _, v in (a.partition("=") for a in run)]
                for run in request["runs"]]
        # verl prints notices on stdout: keep stdout for the answers alone.
        with contextlib.redirect_stdout(sys.stderr):
            return [validate(request["config_dir"], run) for run in runs]


def in_a_fork(line: str) -> dict:
    """The request's answer from a child forked for it; an error when the child fails (its traceback on
    stderr)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(2, 1)  # whatever verl's native code prints stays out of the answers
        code = 1
        try:
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(answer(json.loads(line))))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        body = pipe.read()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return {"results": json.loads(body)} if code == 0 else {"error": f"the request's child exited with {code}"}


def main() -> None:
    for name in WARM:
        importlib.import_module(name)
    for line in sys.stdin:
        print(json.dumps(in_a_fork(line)), flush=True)


if __name__ == "__main__":
    main()
