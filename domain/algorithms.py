"""The algorithm a run's verl settings choose, and what each needs on this stack: GRPO (the default), DAPO's
loss and dynamic sampling, PPO with a critic (GAE), LoRA. docs/recipes.md has one stack-file snippet each.

Read from the composed config as verl reads it (0.6.1 and 0.9.0): what the memory model
(domain/run_memory.py) and the step model (domain/run_time.py) count, and the settings verl's config takes
that cannot run on the stack, refused before anything is created. Pure.
"""

from __future__ import annotations

from domain.bucket import MOUNT_PATH
from domain.platforms import PLATFORMS, VERL_0_9_0
from domain.run_identity import V1_TRAINER_FROM, verl_version_tuple
from domain.verl_settings import Problem, VerlSettings

LORA_TARGETS = {"q": "hidden>hidden", "k": "hidden>kv", "v": "hidden>kv", "o": "hidden>hidden",
                "gate": "hidden>intermediate", "up": "hidden>intermediate", "down": "intermediate>hidden"}
"""The linear layers of a Qwen2 decoder layer LoRA adapts with verl's default target_modules `all-linear`."""
VLLM_MAX_LORA_RANK = 512
"""vLLM's largest max_lora_rank (verl/workers/rollout/vllm_rollout/utils.py get_vllm_max_lora_rank, 0.6.1 and
0.9.0): a larger actor_rollout_ref.model.lora_rank fails when the rollout server starts."""
CRITIC_MODEL = "critic.model.path"
FSDP_ONLY = "verl-gke runs verl's FSDP workers only; use \"fsdp2\" or \"fsdp\"."
FILTER_GROUPS = "algorithm.filter_groups.enable"


def _on(version: str) -> str:
    names = [p.name for p in PLATFORMS.values() if p.verl.version == version]
    return f"{' and '.join(n.upper() for n in names)} (verl {version}) only (verl-gke:platform {' or '.join(names)})"


ELSEWHERE = {"algorithm.filter_groups": f"DAPO's dynamic sampling runs on {_on(VERL_0_9_0.version)}."}
"""verl config sections one release lacks: where they run (verl_settings.check)."""

_ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "opo",
               "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized")
_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ALLOWED: dict[str, dict[str, tuple[str, ...]]] = {
    "0.6.1": {"algorithm.adv_estimator": _ESTIMATORS,
              "actor_rollout_ref.actor.loss_agg_mode": _AGG_MODES,
              "actor_rollout_ref.actor.policy_loss.loss_mode": (
                  "vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "rollout_correction")},
    "0.9.0": {"algorithm.adv_estimator": (*_ESTIMATORS, "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"),
              "actor_rollout_ref.actor.loss_agg_mode": ("token-mean", "token-sum", *_AGG_MODES[1:]),
              "actor_rollout_ref.actor.policy_loss.loss_mode": (
                  "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
                  "cispo", "bypass_mode")},
}
"""The values verl accepts per release (its advantage-estimator and policy-loss registries, ActorConfig's
loss_agg_mode check; tests/test_algorithms.py reads them from the pinned wheels): any other fails on the GPUs."""


def has_critic(run: VerlSettings) -> bool:
    """verl's `need_critic` (verl/trainer/ppo/utils.py, 0.6.1 and 0.9.0): critic.enable when set, else GAE."""
    enable = run.get("critic.enable")
    return bool(enable) if enable is not None else run.get("algorithm.adv_estimator") == "gae"


def lora_rank(run: VerlSettings) -> int:
    """The actor's LoRA rank (0: full fine-tuning)."""
    return int(run.get("actor_rollout_ref.model.lora_rank") or 0)


def name(run: VerlSettings) -> str:
    """The run's algorithm as the plan names it."""
    estimator = str(run.get("algorithm.adv_estimator"))
    base = "PPO with a critic" if has_critic(run) else estimator.upper()
    if verl_version_tuple(run.version) >= V1_TRAINER_FROM and run.get(FILTER_GROUPS):
        base += " with dynamic sampling"
    return base + (f" with LoRA rank {lora_rank(run)}" if lora_rank(run) else "")


def problems(run: VerlSettings, legacy_trainer: bool) -> list[Problem]:
    """Settings verl's config takes that this stack cannot run (verl fails on them once the GPUs are up, or
    ignores them silently)."""
    out: list[Problem] = []

    def add(path: str, message: str) -> None:
        out.append(Problem(path, run.get(path), message))

    if has_critic(run):
        path = run.get(CRITIC_MODEL)
        if not (isinstance(path, str) and path.startswith(f"{MOUNT_PATH}/")):
            add(CRITIC_MODEL, f"the critic's model must be under the bucket mount {MOUNT_PATH}/ that every node "
                "shares (unset, verl-gke starts the critic from the actor's model).")
        if run.get("critic.strategy") == "megatron":
            add("critic.strategy", FSDP_ONLY)
        # validate_config (CriticConfig; the Ulysses rule is 0.6.1's), at the job's start; the batch rule kept with
        # dynamic batches too, as the actor's (domain/grpo_spec.verl_problems).
        batch = run.get("data.train_batch_size")
        if run.get("critic.ppo_mini_batch_size") > batch:
            add("critic.ppo_mini_batch_size", f"must be <= data.train_batch_size ({batch}).")
        sp = run.get("critic.ulysses_sequence_parallel_size") or 1
        if sp > 1 and not run.get("critic.model.use_remove_padding"):
            add("critic.ulysses_sequence_parallel_size", "Ulysses sequence parallel > 1 needs "
                "critic.model.use_remove_padding = true.")
        static = not run.get("critic.use_dynamic_bsz")
        # critic.ppo_micro_batch_size_per_gpu defaults to the deprecated key, and verl refuses the two set together.
        if static and run.get("critic.ppo_micro_batch_size") is not None:
            add("critic.ppo_micro_batch_size", "verl refuses this deprecated key with static batches; set "
                "critic.ppo_micro_batch_size_per_gpu instead.")
        elif static and run.get("critic.ppo_micro_batch_size_per_gpu") is None:
            add("critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz is false, so verl needs the critic's "
                "micro batch size; set it (or leave dynamic batch size on).")
    for path, allowed in ALLOWED[run.version].items():
        if run.get(path) not in allowed:
            add(path, f"verl {run.version} allows {', '.join(allowed)}.")
    rank = lora_rank(run)
    if rank > VLLM_MAX_LORA_RANK:
        add("actor_rollout_ref.model.lora_rank", f"at most {VLLM_MAX_LORA_RANK}: vLLM serves LoRA adapters up to that "
            "rank and refuses to start with a larger one.")
    # verl 0.6.1's config has no filter_groups (only its recipe/dapo trainer samples dynamically); 0.9.0's V1
    # trainer reads it (verl/trainer/ppo/v1/trainer_base.py), its legacy one does not.
    if run.get(FILTER_GROUPS) and legacy_trainer:
        add(FILTER_GROUPS, f"verl {run.version}'s legacy trainer (trainer.use_v1 false, which runBudgetHours needs) "
            "never reads it; drop the budget or the dynamic sampling.")
    elif run.get(FILTER_GROUPS):
        # The V1 trainer raises without a metric, and its replay buffer when a reward reports none by that name
        # (reward_extra_info; the built-in GSM8K reward returns a bare number): both after the GPUs are up.
        metric = run.get("algorithm.filter_groups.metric")
        custom = run.get("custom_reward_function.path") or run.get("reward.custom_reward_function.path")
        if not metric or not custom:
            add(FILTER_GROUPS, "dynamic sampling filters groups by a metric your reward function reports: set "
                "algorithm.filter_groups.metric (such as \"acc\") and a custom_reward_function that returns "
                "{\"score\": ..., \"acc\": ...} (the built-in GSM8K reward returns a bare number).")
        # The same builder asserts the reward is computed while groups are sampled.
        if run.get("reward.reward_model.enable") and not run.get("reward.reward_model.enable_resource_pool"):
            add("reward.reward_model.enable", "dynamic sampling filters on the reward as each group is sampled, and "
                f"a colocated reward model scores only after that (verl {run.version}'s V1 trainer refuses it); set "
                "reward.reward_model.enable_resource_pool: true or use a reward function alone.")
    return out


def critic_defaults(values: dict[str, object]) -> dict[str, object]:
    """What verl-gke sets for a critic the user did not configure: the actor's model (verl's own default is a
    placeholder path, ~/models/deepseek-llm-7b-chat)."""
    adv, enable = values.get("algorithm.adv_estimator"), values.get("critic.enable")
    needed = bool(enable) if enable is not None else adv == "gae"
    if needed and CRITIC_MODEL not in values:
        return {CRITIC_MODEL: values["actor_rollout_ref.model.path"]}
    return {}


def lora_params(hidden: int, intermediate: int, layers: int, kv: int, rank: int) -> int:
    """Parameters of LoRA adapters (A: in x r, B: r x out) on every all-linear target of every layer."""
    sizes = {"hidden": hidden, "intermediate": intermediate, "kv": kv}
    per_layer = sum(sizes[a] + sizes[b] for a, b in (t.split(">") for t in LORA_TARGETS.values()))
    return layers * rank * per_layer
