"""The algorithms a stack runs (domain/algorithms.py): docs/recipes.md's snippets through synth and verl's own
validate_config, what the memory and step models count for a critic and LoRA, and the response length in the
modeled step (issue 49, items 3-4)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain import algorithms, run_memory, run_time
from domain.config import load_config
from domain.platforms import PLATFORMS
from domain.verl_wheel import unpacked
from tests.conftest import BASE_CONFIG, verl_value
from tests.test_verl_settings import refused
from tests.test_verl_config import ASKS_VERL, _platform, job_args, verl_verdicts
from verl_gke import synth

RECIPES = Path(__file__).resolve().parent.parent / "docs" / "recipes.md"
_SNIPPET = re.compile(r"```yaml\n# stack: (?P<stack>[\w-]+)\n(?P<body>.*?)```", re.S)


def recipes() -> list[tuple[str, dict[str, Any]]]:
    """(stack, config) of every snippet on the page."""
    found = [(m["stack"], yaml.safe_load(m["body"])["config"]) for m in _SNIPPET.finditer(RECIPES.read_text())]
    assert len(found) == 5, "one snippet per algorithm and the warm start"
    return found


@ASKS_VERL
@pytest.mark.timeout(900)
def test_every_recipe_synthesizes_and_verl_accepts_it() -> None:
    results = [(stack, synth.run(stack, overrides=config)) for stack, config in recipes()]
    for release in {PLATFORMS[_platform(stack)].verl for stack, _ in results}:
        runs = [job_args(result) for stack, result in results if PLATFORMS[_platform(stack)].verl == release]
        assert verl_verdicts(release, runs) == [None] * len(runs)
    plans = [next(line for line in r.log if " run with verl " in line) for _, r in results]
    assert [p.split(" run with verl ")[0] for p in plans] == ["GRPO", "GRPO", "PPO with a critic",
                                                             "GRPO with LoRA rank 64", "GRPO"]


def _cfg(**paths: object):
    return load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(paths)})


def _estimate(cfg) -> run_memory.MemoryEstimate:
    est = run_memory.for_run(cfg.verl, cfg.facts, cfg.model, cfg.gpu_nodes)
    assert est is not None
    return est


GIB = run_memory.GIB


def test_a_critic_as_large_as_the_actor_is_in_every_phase_of_the_memory_estimate() -> None:
    grpo, ppo = _estimate(_cfg()), _estimate(_cfg(**{"algorithm.adv_estimator": "gae"}))
    params, n = run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"].params, 16
    for before, after in zip(grpo.phases, ppo.phases):
        added = after.parts["critic state"]
        # fp32 weights and AdamW moments (12 bytes a parameter), and its fp32 gradients in training.
        assert added == params * (12 + (4 if after.name == "training" else 0)) / n
        assert after.total - before.total == added
    assert (round(grpo.peak.total / GIB), round(ppo.peak.total / GIB)) == (130, 153)  # docs/recipes.md


def test_lora_trains_the_adapters_alone_and_keeps_no_reference_copy() -> None:
    full = _estimate(_cfg(**{"actor_rollout_ref.actor.use_kl_loss": True}))
    lora = _estimate(_cfg(**{"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.model.lora_rank": 64}))
    params, n = run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"].params, 16
    training = {p.name: p for p in lora.phases}["training"]
    adapters = 64 * 64 * (2 * (5120 + 5120) + 2 * (5120 + 1024) + 2 * (5120 + 27648) + (27648 + 5120))
    assert training.parts["actor state"] == params * 4 / n + adapters * 12 / n
    assert training.parts["reference"] == 0 and {p.name: p for p in full.phases}["training"].parts["reference"] > 0
    plain = {p.name: round(p.total / GIB) for p in _estimate(_cfg()).phases}
    lora_plain = {p.name: round(p.total / GIB)
                  for p in _estimate(_cfg(**{"actor_rollout_ref.model.lora_rank": 64})).phases}
    assert (plain["training"], lora_plain["training"]) == (57, 34)  # docs/recipes.md


def _modeled(cfg) -> run_time.RunTime:
    from domain.verl_config import verl_run_check

    problems, plan = verl_run_check(cfg)
    assert problems == [] and plan is not None and plan.time is not None
    return plan.time


def test_the_step_model_counts_the_critics_passes_and_loras_cheaper_update() -> None:
    grpo = _modeled(_cfg())
    ppo = _modeled(_cfg(**{"algorithm.adv_estimator": "gae"}))
    lora = _modeled(_cfg(**{"actor_rollout_ref.model.lora_rank": 64}))
    # Gradient checkpointing on: the actor's update 8 FLOPs a parameter a token, the critic's 8 more; one value pass.
    assert ppo.update_s == pytest.approx(grpo.update_s * 16 / 8)
    assert ppo.log_prob_s == pytest.approx(grpo.log_prob_s * 2)
    assert lora.update_s == pytest.approx(grpo.update_s * 6 / 8)
    assert ppo.shape.model_loads == 2 and lora.shape.model_loads == 1
    assert 1.5 <= ppo.modeled_step_s / grpo.modeled_step_s < 1.6  # docs/recipes.md: about 1.5x


def test_max_response_length_changes_modeled_step_seconds_through_synth() -> None:
    """Issue 49 item 4: a 15,872-token response limit waits for its longest responses (the tail); with the
    512-token prompt it fills the actor's 16,384-token budget (a longer one is refused)."""
    plain = synth.run("a4-standard")
    longer = synth.run("a4-standard", overrides={"verl-gke:verl": {"data": {"max_response_length": 15872}}})
    tail = (15872 - 512) * run_time.TAIL_TOKEN_S
    assert longer.outputs["modeledStepSeconds"] == pytest.approx(plain.outputs["modeledStepSeconds"] + tail, abs=0.1)


A4X = PLATFORMS["a4x"]
DAPO_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
              "    acc = float(solution_str.strip().endswith(str(ground_truth)))\n" \
              "    return {\"score\": acc, \"acc\": acc}\n"


@pytest.fixture(scope="module")
def dapo_reward(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """verl-gke:rewardFunction of a reward that reports dynamic sampling's metric."""
    reward = tmp_path_factory.mktemp("reward") / "dapo_reward.py"
    reward.write_text(DAPO_REWARD)
    return {"verl-gke:rewardFunction": str(reward)}


@pytest.fixture(scope="module")
def a4x_runs(dapo_reward: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(algorithm as the plan names it, job overrides) of each algorithm snippet of docs/recipes.md and DAPO's
    dynamic sampling (A4X only), synthesized on a4x."""
    dynamic = {**dapo_reward, "verl-gke:verl": {"algorithm": {"filter_groups": {
        "enable": True, "metric": "acc"}}}}
    snippets = [config for _, config in recipes() if "verl-gke:startFrom" not in config] + [dynamic]
    runs = []
    for config in snippets:
        result = synth.run("a4x", overrides=config)
        plan = next(line for line in result.log if " run with verl " in line)
        runs.append((plan.split(" run with verl ")[0], job_args(result)))
    assert [name for name, _ in runs] == ["GRPO", "GRPO", "PPO with a critic", "GRPO with LoRA rank 64",
                                          "GRPO with dynamic sampling"]
    return runs


def _with(args: list[str], paths: dict[str, object]) -> list[str]:
    """`args` with each path's value replaced (Hydra refuses a key given twice), or added."""
    kept = [a for a in args if a.split("=", 1)[0].lstrip("+") not in paths]
    return kept + [f"{k}={'null' if v is None else v}" for k, v in paths.items()]


A4X_CONFIG = {"verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"}
CRITIC, LORA = {"algorithm.adv_estimator": "gae"}, {"actor_rollout_ref.model.lora_rank": 64}
DAPO = {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc"}
# (recipe, its index in a4x_runs, the change, verl 0.9.0's verdict, synth's line or None: not known offline)
BAD_ON_A4X = [
    (CRITIC, 2, {"critic.use_dynamic_bsz": False, "critic.ppo_mini_batch_size": 512,
                 "critic.ppo_micro_batch_size_per_gpu": 4},
     "ValueError: train_batch_size (256) must be >= critic.ppo_mini_batch_size (512)",
     "verl-gke:verl.critic.ppo_mini_batch_size = 512: must be <= data.train_batch_size (256)."),
    (CRITIC, 2, {"critic.use_dynamic_bsz": False},
     "InstantiationException at critic: ValueError: [critic] Please set at least one of 'critic.micro_batch_size' "
     "or 'critic.micro_batch_size_per_gpu'.",
     "verl-gke:verl.critic.ppo_micro_batch_size_per_gpu = null: critic.use_dynamic_bsz is false, so verl needs "
     "the critic's micro batch size; set it (or leave dynamic batch size on)."),
    (CRITIC, 2, {"critic.use_dynamic_bsz": False, "critic.ppo_micro_batch_size": 16},
     "InstantiationException at critic: ValueError: [critic] You have set both 'critic.micro_batch_size' AND "
     "'critic.micro_batch_size_per_gpu'. Please remove 'critic.micro_batch_size' because only "
     "'*_micro_batch_size_per_gpu' is supported (the former is deprecated).",
     "verl-gke:verl.critic.ppo_micro_batch_size = 16: verl refuses this deprecated key with static batches; set "
     "critic.ppo_micro_batch_size_per_gpu instead."),
    # verl reads the folder only at the job's start: preview refuses it first (tests/test_preflight.py).
    (CRITIC, 2, {"critic.model.path": "/data/no-such-model"},
     "InstantiationException at critic.model: HFValidationError: Repo id must be in the form 'repo_name' or "
     "'namespace/repo_name': '/data/no-such-model'. Use `repo_type` argument if needed.", None),
    (LORA, 3, {"actor_rollout_ref.model.lora_rank": 1024},
     "ValueError: lora_rank must be less than or equal to 512, but got 1024",
     "verl-gke:verl.actor_rollout_ref.model.lora_rank = 1024: at most 512: vLLM serves LoRA adapters up to that rank "
     "and refuses to start with a larger one."),
    (DAPO, 4, {"algorithm.filter_groups.metric": None},
     "ValueError: algorithm.filter_groups.metric must be set when group filtering is enabled",
     "verl-gke:verl.algorithm.filter_groups.enable = true: dynamic sampling filters groups by a metric your reward "
     "function reports: set algorithm.filter_groups.metric (such as \"acc\") and a custom_reward_function that "
     "returns {\"score\": ..., \"acc\": ...} (the built-in GSM8K reward returns a bare number)."),
    (DAPO, 4, {"reward.reward_model.enable": True},
     "AssertionError: algorithm.filter_groups requires the reward metric at sampling time: use rule-based reward "
     "or reward.reward_model.enable_resource_pool=True. A colocated reward model computes rewards only after "
     "replay-buffer sampling.",
     "verl-gke:verl.reward.reward_model.enable = true: dynamic sampling filters on the reward as each group is "
     "sampled, and a colocated reward model scores only after that (verl 0.9.0's V1 trainer refuses it); set "
     "reward.reward_model.enable_resource_pool: true or use a reward function alone."),
]


@ASKS_VERL
@pytest.mark.timeout(900)
def test_verl_0_9_0_itself_accepts_each_algorithm_on_a4x_and_refuses_what_it_cannot_run(
        a4x_runs: list[tuple[str, list[str]]]) -> None:
    """A critic and LoRA reach verl 0.9.0's own validate_config (the critic's model read, vLLM's LoRA ranks and
    version asked), and dynamic sampling the V1 trainer's own filter check, as on the x86 stacks."""
    runs = [args for _, args in a4x_runs]
    bad = [_with(runs[index], change) for _, index, change, _, _ in BAD_ON_A4X]
    verdicts = verl_verdicts(A4X.verl, [*runs, *bad])
    assert verdicts[:len(runs)] == [None] * len(runs)
    assert verdicts[len(runs):] == [verdict for _, _, _, verdict, _ in BAD_ON_A4X]


@pytest.mark.parametrize(("recipe", "change", "line"), [(r, c, line) for r, _, c, _, line in BAD_ON_A4X if line])
def test_what_verl_0_9_0_refuses_synth_refuses_in_one_line(recipe: dict, change: dict, line: str,
                                                           dapo_reward: dict[str, str]) -> None:
    assert refused({**recipe, **change}, **A4X_CONFIG, **(dapo_reward if recipe is DAPO else {})) == [line]


def test_a_critic_with_ulysses_needs_remove_padding_as_verl_0_6_1_refuses_it() -> None:
    """verl 0.6.1's critic model leaves use_remove_padding off (tests/test_verl_config.py holds verl's verdict)."""
    assert refused({**CRITIC, "critic.ulysses_sequence_parallel_size": 2}) == [
        "verl-gke:verl.critic.ulysses_sequence_parallel_size = 2: Ulysses sequence parallel > 1 needs "
        "critic.model.use_remove_padding = true."]
    assert load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(
        {**CRITIC, "critic.ulysses_sequence_parallel_size": 2, "critic.model.use_remove_padding": True})})


def test_dynamic_sampling_with_a_reward_model_in_its_own_pool_is_accepted(dapo_reward: dict[str, str]) -> None:
    pooled = {**DAPO, "reward.reward_model.enable": True, "reward.reward_model.enable_resource_pool": True}
    assert load_config({**BASE_CONFIG, "verl-gke:verl": verl_value(pooled), **A4X_CONFIG, **dapo_reward}).verl.get(
        "reward.reward_model.enable_resource_pool") is True


@ASKS_VERL
@pytest.mark.timeout(300)
def test_verl_0_9_0_refuses_lora_with_a_vllm_older_than_its_range(a4x_runs: list[tuple[str, list[str]]]) -> None:
    """The image's vLLM version is what verl's own version check reads: one below 0.18 is refused."""
    lora = a4x_runs[3][1]
    assert verl_verdicts(A4X.verl, [lora], vllm_version="0.12.0") == [
        "ValueError: vllm version 0.12.0 not supported and SGLang also not Found. Currently supported vllm versions "
        "are 0.18.0+"]


_STAND_IN_PROBE = """
import json, sys, typing
from importlib.metadata import version
from pathlib import Path
from verl_standins import VllmStandIn
VllmStandIn(Path(sys.argv[1]), "0.23.0", Path(sys.argv[2]))
from vllm.config.lora import MaxLoRARanks
from vllm.outputs import RequestOutput
out = {"version": version("vllm"), "ranks": list(typing.get_args(MaxLoRARanks))}
try:
    from vllm.lora.request import NoSuchName
except ImportError as e:
    out["name"] = str(e).split(" (")[0]
try:
    import vllm.no_such_module
except ModuleNotFoundError as e:
    out["module"] = str(e)
try:
    RequestOutput()
except RuntimeError as e:
    out["call"] = str(e)
print(json.dumps(out))
"""


def test_the_vllm_stand_in_serves_only_what_the_images_vllm_source_binds(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests import vllm_source

    source = vllm_source.unpacked(A4X.image_vllm)
    done = subprocess.run([sys.executable, "-c", _STAND_IN_PROBE, str(source), str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(Path(__file__).parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    # vLLM 0.23.0's vllm/config/lora.py: MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512].
    assert json.loads(done.stdout) == {
        "version": "0.23.0", "ranks": [1, 8, 16, 32, 64, 128, 256, 320, 512],
        "name": "cannot import name 'NoSuchName' from 'vllm.lora.request'",
        "module": "No module named 'vllm.no_such_module'",
        "call": "stand-in for vllm.outputs.RequestOutput: the real vLLM needs the A4X image"}
    assert json.loads(done.stdout)["ranks"][-1] == algorithms.VLLM_MAX_LORA_RANK  # synth's own LoRA rule


def test_the_model_stand_in_gives_verl_the_pinned_shape_and_the_real_special_token_ids(tmp_path: Path) -> None:
    import dataclasses

    from transformers import AutoConfig, AutoTokenizer

    from tests.verl_standins import write_qwen2_model

    write_qwen2_model(tmp_path, dataclasses.asdict(run_memory.MODELS["Qwen/Qwen2.5-32B-Instruct"]))
    config, tokenizer = AutoConfig.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert (config.architectures, config.num_attention_heads, config.num_key_value_heads, config.hidden_size,
            config.vocab_size, config.tie_word_embeddings) == (["Qwen2ForCausalLM"], 40, 8, 5120, 152064, False)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (None, 151645, 151643)
    assert tokenizer.encode("<|im_start|>hi<|im_end|>")[::3] == [151644, 151645]


def _registered(root: Path) -> dict[str, tuple[str, ...]]:
    """What verl's own source allows, read from the wheel: the advantage estimators and policy losses its
    registries hold (register_adv_est / register_policy_loss in verl/trainer/ppo/core_algos.py) and ActorConfig's
    valid_loss_agg_modes (verl/workers/config/actor.py)."""
    core = ast.parse((root / "verl/trainer/ppo/core_algos.py").read_text())
    enum = next({t.targets[0].id: t.value.value for t in n.body if isinstance(t, ast.Assign)}
                for n in core.body if isinstance(n, ast.ClassDef) and n.name == "AdvantageEstimator")

    def names(decorator: str) -> tuple[str, ...]:
        args = [d.args[0] for fn in ast.walk(core) for d in getattr(fn, "decorator_list", [])
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == decorator]
        return tuple(sorted(a.value if isinstance(a, ast.Constant) else enum[a.attr] for a in args))
    actor = ast.parse((root / "verl/workers/config/actor.py").read_text())
    modes = next(n.value for n in ast.walk(actor)
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "valid_loss_agg_modes")
    return {"algorithm.adv_estimator": names("register_adv_est"),
            "actor_rollout_ref.actor.loss_agg_mode": tuple(sorted(e.value for e in modes.elts)),
            "actor_rollout_ref.actor.policy_loss.loss_mode": names("register_policy_loss")}


def test_the_allowed_values_are_what_each_pinned_verl_wheel_registers() -> None:
    releases = {p.verl.version: p.verl for p in PLATFORMS.values()}
    assert {v: {path: tuple(sorted(allowed)) for path, allowed in algorithms.ALLOWED[v].items()}
            for v in releases} == {v: _registered(unpacked(r)) for v, r in releases.items()}


@pytest.mark.parametrize(("path", "value", "config", "line"), [
    ("algorithm.adv_estimator", "foo", {}, 'verl-gke:verl.algorithm.adv_estimator = "foo": verl 0.6.1 allows gae, '
     "grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo, opo, grpo_passk, gpg, rloo_vectorized, "
     "grpo_vectorized."),
    ("actor_rollout_ref.actor.loss_agg_mode", "token-sum", {}, 'verl-gke:verl.actor_rollout_ref.actor.loss_agg_mode '
     '= "token-sum": verl 0.6.1 allows token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm.'),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "sapo", {}, "verl-gke:verl.actor_rollout_ref.actor.policy_loss."
     'loss_mode = "sapo": verl 0.6.1 allows vanilla, gspo, gpg, clip_cov, kl_cov, geo_mean, rollout_correction.'),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "dapo", A4X_CONFIG, "verl-gke:verl.actor_rollout_ref.actor."
     'policy_loss.loss_mode = "dapo": verl 0.9.0 allows vanilla, dppo_tv, dppo_kl, gspo, sapo, gpg, clip_cov, '
     "kl_cov, geo_mean, dro, cispo, bypass_mode."),
])
def test_a_value_verl_does_not_register_is_refused_with_what_it_allows(path: str, value: str, config: dict,
                                                                       line: str) -> None:
    assert refused({path: value}, **config) == [line]


@pytest.mark.parametrize(("path", "value", "config"), [
    ("actor_rollout_ref.actor.loss_agg_mode", "token-sum", A4X_CONFIG),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "gspo", {}),
    ("algorithm.adv_estimator", "rloo", {})])
def test_a_value_verl_registers_is_accepted(path: str, value: str, config: dict) -> None:
    assert load_config({**BASE_CONFIG, "verl-gke:verl": verl_value({path: value}), **config}).verl.get(path) == value
