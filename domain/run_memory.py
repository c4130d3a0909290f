"""The GRPO run's memory per GPU, estimated before any GPU is paid for, and the rollout tensor
parallel size chosen for the GPU's memory.

verl colocates actor, reference and vLLM on every GPU, so a GPU must hold the larger of two phases:
training (the sharded fp32 actor, gradients and AdamW moments, the bf16 reference shard, two gathered
layers, one micro batch's activations and logits, and verl 0.9.0's unsharded deferred gradient) and
rollout (the actor state left on the GPU plus vLLM's `gpu_memory_utilization` share). An estimate for
a refusal with a margin (fragmentation, CUDA context, NCCL buffers), not a profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from domain.platforms import Platform
from domain.verl_settings import VerlSettings

GIB = 2**30
"""Memory is counted in the units the devices report (nvidia-smi's MiB, CUDA's bytes)."""
MARGIN = 0.10
"""Share of a GPU's memory an estimate must leave free."""
VLLM_NON_KV_GIB = 4.0
"""vLLM's own use inside its budget besides weights and KV cache (profiled activations, CUDA graphs,
sampler): a few GiB at verl's max_num_batched_tokens (8192)."""
TP_CHOICES = (1, 2, 4, 8)
WEIGHT_SHARE_MAX = 0.25
"""Largest share of vLLM's budget the rollout weight shard may take: every decode step reads the whole
shard once for the batch, so a replica whose weights fill its budget has little KV cache to batch
sequences over (a 32B model in bf16 gets TP 4 on 140-185 GiB GPUs at 0.6, as verl's 32B example runs)."""
# Bytes per parameter of the actor state under FSDP: fp32 weights 4, fp32 gradients 4, AdamW 8.
_WEIGHTS, _GRADS, _ADAM = 4, 4, 8
_BF16 = 2
# Activations one decoder layer keeps for its backward, per token, in bf16 values: attention
# inputs/outputs (~10 x hidden, no score matrix with flash attention) and the SwiGLU MLP's gate, up,
# activation and product (4 x intermediate); Korthikanti et al. 2022 (arXiv:2205.05198) section 4.1,
# with the MLP widened to SwiGLU.
_ATTN_VALUES, _MLP_VALUES = 10, 4


@dataclass(frozen=True)
class ModelShape:
    """A decoder's sizes, from its config.json on Hugging Face."""

    hidden: int
    intermediate: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    @property
    def layer_params(self) -> int:
        q_o = 2 * self.hidden * self.hidden
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_o + kv + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params + embeddings

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token, bf16, across the whole model."""
        return 2 * self.layers * self.kv_heads * self.head_dim * _BF16


MODELS: dict[str, ModelShape] = {
    # huggingface.co/Qwen/Qwen2.5-32B-Instruct config.json: 32.8B parameters.
    "Qwen/Qwen2.5-32B-Instruct": ModelShape(5120, 27648, 64, 8, 128, 152064, False),
    # huggingface.co/Qwen/Qwen2.5-7B-Instruct config.json.
    "Qwen/Qwen2.5-7B-Instruct": ModelShape(3584, 18944, 28, 4, 128, 152064, False),
    # huggingface.co/Qwen/Qwen2.5-1.5B-Instruct config.json: 1.5B parameters, tied embeddings.
    "Qwen/Qwen2.5-1.5B-Instruct": ModelShape(1536, 8960, 28, 2, 128, 151936, True),
    # huggingface.co/Qwen/Qwen2.5-0.5B-Instruct config.json (the smoke stack's, verl's quickstart model): 0.49B.
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(896, 4864, 24, 2, 64, 151936, True),
}


@dataclass(frozen=True)
class Phase:
    name: str
    parts: dict[str, float]
    """What takes the memory, in bytes."""
    keys: tuple[str, ...]
    """The verl paths that size this phase (named when it does not fit)."""
    why: str = ""
    """What to do about it, when it does not fit."""

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class MemoryEstimate:
    gpu_bytes: float
    phases: tuple[Phase, ...]
    kv_cache_bytes: float
    """vLLM's KV cache per GPU: its budget less the rollout weight shard and its own use."""
    sequence_len: int

    @property
    def limit_bytes(self) -> float:
        return self.gpu_bytes * (1 - MARGIN)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def line(self) -> str:
        parts = ", ".join(f"{p.name} {p.total / GIB:.0f}" for p in self.phases)
        return (f"GPU memory estimate per GPU: peak {self.peak.total / GIB:.0f} GiB ({self.peak.name}) of "
                f"{self.gpu_bytes / GIB:.0f} GiB, limit {self.limit_bytes / GIB:.0f} GiB with a {MARGIN:.0%} margin "
                f"(phases in GiB: {parts})")


def _tokens(dynamic: bool, max_tokens: int | None, micro: int | None, seq: int) -> int:
    """Tokens of the largest micro batch: packed up to the budget (a longer sequence goes alone), or
    micro x the padded length."""
    if dynamic and max_tokens:
        return max(max_tokens, seq)
    return (micro or 1) * seq


def update_micro_batches(run: VerlSettings, n_gpus: int) -> tuple[int, int]:
    """(the most micro-batches a GPU's share of one mini-batch takes in the actor update, that share in tokens
    at full length). verl splits it by ppo_max_token_len_per_gpu x the Ulysses size with dynamic batch size
    (verl/utils/seqlen_balancing.py rearrange_micro_batches: ceil(tokens / budget), the largest across
    data-parallel ranks), else by ppo_micro_batch_size_per_gpu."""
    actor = "actor_rollout_ref.actor."
    sp = run.get(actor + "ulysses_sequence_parallel_size") or 1
    seq = run.get("data.max_prompt_length") + run.get("data.max_response_length")
    sequences = math.ceil(run.get(actor + "ppo_mini_batch_size") * run.get("actor_rollout_ref.rollout.n")
                          / max(n_gpus // sp, 1))
    if run.get(actor + "use_dynamic_bsz"):
        return max(1, math.ceil(sequences * seq / (run.get(actor + "ppo_max_token_len_per_gpu") * sp))), sequences * seq
    return max(1, math.ceil(sequences / (run.get(actor + "ppo_micro_batch_size_per_gpu") or 1))), sequences * seq


def estimate(run: VerlSettings, shape: ModelShape, gpu_bytes: float, n_gpus: int) -> MemoryEstimate:
    """The per-GPU memory of each phase of the run on `n_gpus` GPUs of `gpu_bytes` each, from verl's
    composed config."""
    actor, rollout, ref_ = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.ref."
    params, seq = shape.params, run.get("data.max_prompt_length") + run.get("data.max_response_length")
    dynamic = bool(run.get(actor + "use_dynamic_bsz"))
    resident = params * (_WEIGHTS + _ADAM) / n_gpus
    ref = params * _BF16 / n_gpus if has_reference(run) else 0.0
    gathered = 2 * shape.layer_params * _BF16
    train_tokens = _tokens(dynamic, run.get(actor + "ppo_max_token_len_per_gpu"),
                           run.get(actor + "ppo_micro_batch_size_per_gpu"), seq)
    layer_values = _ATTN_VALUES * shape.hidden + _MLP_VALUES * shape.intermediate
    update_keys = (actor + "ppo_max_token_len_per_gpu",) if dynamic else (actor + "ppo_micro_batch_size_per_gpu",)
    training = {
        "actor state": resident + params * _GRADS / n_gpus,
        "reference": ref,
        "gathered layers": gathered,
        "checkpointed activations": train_tokens * shape.hidden * _BF16 * shape.layers,
        "recomputed layer": train_tokens * layer_values * _BF16,
        "logits and their gradient": train_tokens * shape.vocab * 2 * _BF16,
    }
    micro_batches, share = update_micro_batches(run, n_gpus)
    why = "lower it or add GPU nodes"
    if micro_batches > 1 and run.release.defers_gradient_sync:
        # Every micro-batch but the last keeps its whole-model gradient unsharded, in the fp32 reduce dtype.
        training["unsharded fp32 gradient"] = params * _GRADS
        update_keys = (actor + "ppo_mini_batch_size", *update_keys)
        why = (f"verl {run.version} keeps an unsharded fp32 gradient of the whole model while a mini-batch takes "
               f"several micro-batches ({micro_batches} here: a GPU's share of a mini-batch is up to {share} tokens); "
               f"make ppo_max_token_len_per_gpu x the Ulysses size at least that share (one micro-batch), lower "
               f"ppo_mini_batch_size or add GPU nodes")
    # The reference policy's pass runs only where verl builds one.
    roles = (rollout, ref_) if has_reference(run) else (rollout,)
    lp_dynamic = [bool(run.get(role + "log_prob_use_dynamic_bsz")) for role in roles]
    lp_tokens = max(_tokens(d, run.get(role + "log_prob_max_token_len_per_gpu"),
                            run.get(role + "log_prob_micro_batch_size_per_gpu"), seq)
                    for d, role in zip(lp_dynamic, roles))
    log_prob = Phase("log-prob", {
        "actor state": resident,
        "reference": ref,
        "gathered layers": gathered,
        "layer activations": lp_tokens * layer_values * _BF16,
        # bf16 logits and the fp32 log-softmax verl takes of them.
        "logits": lp_tokens * shape.vocab * (_BF16 + 4),
    }, tuple(role + ("log_prob_max_token_len_per_gpu" if d else "log_prob_micro_batch_size_per_gpu")
             for d, role in zip(lp_dynamic, roles)), "lower it or add GPU nodes")
    vllm = run.get(rollout + "gpu_memory_utilization") * gpu_bytes
    rollout_phase = Phase("rollout", {"actor state": resident, "reference": ref, "vLLM": vllm},
                          (rollout + "gpu_memory_utilization",), "lower it or add GPU nodes")
    kv = vllm - params * _BF16 / run.get(rollout + "tensor_model_parallel_size") - VLLM_NON_KV_GIB * GIB
    return MemoryEstimate(gpu_bytes, (Phase("training", training, update_keys, why), log_prob, rollout_phase),
                          kv, seq)


def kv_bytes_per_token_per_gpu(shape: ModelShape, tp: int) -> float:
    """A token's KV cache on one GPU of a TP group (KV heads are split, or copied when fewer than tp)."""
    return shape.kv_bytes_per_token * max(shape.kv_heads // tp, 1) / shape.kv_heads


def has_reference(run: VerlSettings) -> bool:
    """verl builds the reference policy only for a KL loss or in-reward KL (main_ppo)."""
    return bool(run.get("actor_rollout_ref.actor.use_kl_loss") or run.get("algorithm.use_kl_in_reward"))


def for_run(run: VerlSettings, platform: Platform, model: str, nnodes: int) -> MemoryEstimate | None:
    """The run's estimate; None for a model not in MODELS."""
    shape = MODELS.get(model)
    if shape is None or not platform.gpu_memory_mib:
        return None
    return estimate(run, shape, platform.gpu_memory_bytes, platform.gpus_per_node * nnodes)


def summary_line(run: VerlSettings, platform: Platform, model: str, nnodes: int) -> str:
    est = for_run(run, platform, model, nnodes)
    return est.line() if est else f"GPU memory estimate per GPU: not made ({model} is not in the model table)"


def problems(run: VerlSettings, platform: Platform, model: str, nnodes: int) -> list[tuple[tuple[str, ...], str]]:
    """(verl paths, message) for each phase that would not fit the GPU with the margin."""
    est = for_run(run, platform, model, nnodes)
    if est is None:
        return []
    shape = MODELS[model]
    out = []
    for phase in est.phases:
        if phase.total > est.limit_bytes:
            top = sorted(((k, v) for k, v in phase.parts.items() if v), key=lambda kv: -kv[1])[:3]
            parts = ", ".join(f"{name} {value / GIB:.0f}" for name, value in top)
            out.append((phase.keys, f"the {phase.name} phase needs ~{phase.total / GIB:.0f} GiB per GPU "
                        f"({parts} GiB) of the {platform.gpu_memory_gib:.0f} GiB {platform.accelerator}, over the "
                        f"{est.limit_bytes / GIB:.0f} GiB limit ({MARGIN:.0%} margin): {phase.why}"))
    tp = run.get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    tokens = est.kv_cache_bytes / kv_bytes_per_token_per_gpu(shape, tp)
    if tokens < est.sequence_len:
        out.append((("actor_rollout_ref.rollout.tensor_model_parallel_size",
                     "actor_rollout_ref.rollout.gpu_memory_utilization"),
                    f"vLLM's KV cache (~{max(est.kv_cache_bytes / GIB, 0):.0f} GiB per GPU) holds {max(int(tokens), 0)} "
                    f"tokens, fewer than one sequence ({est.sequence_len}): vLLM refuses to start; raise either"))
    return out


def rollout_tp(platform: Platform, model: str, *, util: float, batch: int, n: int, seq: int, nnodes: int) -> int:
    """The smallest rollout tensor parallel size whose weight shard takes at most WEIGHT_SHARE_MAX of
    vLLM's budget and whose KV cache holds each replica's share of a whole rollout batch at full
    length (so the batch decodes without preemption): more replicas where memory allows. The
    platform's GPUs per node for a model not in MODELS."""
    shape = MODELS.get(model)
    if shape is None or not platform.gpu_memory_mib:
        return platform.gpus_per_node
    n_gpus = platform.gpus_per_node * nnodes
    for tp in TP_CHOICES:
        if tp > platform.gpus_per_node:
            break
        budget, shard = util * platform.gpu_memory_bytes, shape.params * _BF16 / tp
        kv = budget - shard - VLLM_NON_KV_GIB * GIB
        share = batch * n * seq / max(n_gpus // tp, 1)
        if shard <= WEIGHT_SHARE_MAX * budget and kv >= share * kv_bytes_per_token_per_gpu(shape, tp):
            return tp
    return platform.gpus_per_node


MERGE_BYTES_PER_PARAM = 8
"""verl's merger holds the fp32 model shards (4 bytes a parameter) and the merged copy beside them
(workloads/export_model.memory_needed: twice the shards)."""


def merge_memory_bytes(model: str) -> int | None:
    """Memory verl's merger needs for `model`'s checkpoint (Qwen2.5-32B: some 262 GB, a GPU worker node's);
    None for a model not in MODELS: the export then runs on the head, and refuses to start if it would not fit."""
    shape = MODELS.get(model)
    return shape.params * MERGE_BYTES_PER_PARAM if shape else None
