"""The GRPO run's memory per GPU, estimated before any GPU is paid for, and the rollout tensor
parallel size chosen for the GPU's memory.

verl colocates the FSDP actor, the reference policy and the vLLM rollout on every GPU (its hybrid
engine), so a GPU must hold, at its peak, the larger of two phases:
- training: the sharded actor state (fp32 weights, fp32 gradients, two fp32 AdamW moments:
  verl's FSDP workers load the actor in fp32 and compute in bf16), the reference policy's bf16
  shard, two gathered bf16 layers (FSDP prefetch), one micro batch's activations with gradient
  checkpointing (verl's default, `enable_gradient_checkpointing: true`) and its bf16 logits and
  their gradient;
- rollout: the actor's weights and optimizer state that stay on the GPU (verl offloads neither by
  default; gradients are freed) plus vLLM's whole budget, `gpu_memory_utilization` x the GPU's
  memory (vLLM >= 0.10 refuses to start unless that much is free, and holds the rollout weights
  and KV cache inside it).
The figures are an estimate for a refusal with a margin, not a profile: fragmentation, CUDA
context and NCCL buffers are what the margin is for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.grpo_spec import GrpoSpec
from domain.platforms import Platform

GB = 1e9
MARGIN = 0.10
"""Share of a GPU's memory an estimate must leave free."""
VLLM_NON_KV_GB = 4.0
"""vLLM's own use inside its budget besides weights and KV cache (profiled activations, CUDA graphs,
sampler): a few GB at verl's max_num_batched_tokens (8192)."""
TP_CHOICES = (1, 2, 4, 8)
WEIGHT_SHARE_MAX = 0.25
"""Largest share of vLLM's budget the rollout weight shard may take: every decode step reads the whole
shard once for the batch, so a replica whose weights fill its budget has little KV cache to batch
sequences over (a 32B model in bf16 gets TP 4 on 141-186 GB GPUs at 0.6, as verl's 32B example runs)."""
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
}


@dataclass(frozen=True)
class Phase:
    name: str
    parts: dict[str, float]
    """What takes the memory, in bytes."""
    keys: tuple[str, ...]
    """The grpo fields that size this phase (named when it does not fit)."""

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class MemoryEstimate:
    gpu_gb: float
    phases: tuple[Phase, ...]
    kv_cache_gb: float
    """vLLM's KV cache per GPU: its budget less the rollout weight shard and its own use."""
    sequence_len: int

    @property
    def limit_gb(self) -> float:
        return self.gpu_gb * (1 - MARGIN)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def line(self) -> str:
        parts = ", ".join(f"{p.name} {p.total / GB:.0f}" for p in self.phases)
        return (f"GPU memory estimate per GPU: peak {self.peak.total / GB:.0f} GB ({self.peak.name}) of "
                f"{self.gpu_gb:.0f} GB, limit {self.limit_gb:.0f} GB with a {MARGIN:.0%} margin "
                f"(phases in GB: {parts})")


def _tokens(dynamic: bool, max_tokens: int | None, micro: int, seq: int) -> int:
    """Tokens of the largest micro batch: packed up to the budget (a longer sequence goes alone), or
    micro x the padded length."""
    if dynamic and max_tokens:
        return max(max_tokens, seq)
    return micro * seq


def estimate(spec: GrpoSpec, shape: ModelShape, gpu_gb: float, n_gpus: int,
             ref_model: bool) -> MemoryEstimate:
    """The per-GPU memory of each phase of the run on `n_gpus` GPUs of `gpu_gb` each."""
    params, seq = shape.params, spec.max_prompt_length + spec.max_response_length
    dynamic = bool(spec.use_dynamic_bsz)
    resident = params * (_WEIGHTS + _ADAM) / n_gpus
    ref = params * _BF16 / n_gpus if ref_model else 0.0
    gathered = 2 * shape.layer_params * _BF16
    train_tokens = _tokens(dynamic, spec.ppo_max_token_len_per_gpu, spec.ppo_micro_batch_size_per_gpu, seq)
    layer_values = _ATTN_VALUES * shape.hidden + _MLP_VALUES * shape.intermediate
    training = Phase("training", {
        "actor state": resident + params * _GRADS / n_gpus,
        "reference": ref,
        "gathered layers": gathered,
        "checkpointed activations": train_tokens * shape.hidden * _BF16 * shape.layers,
        "recomputed layer": train_tokens * layer_values * _BF16,
        "logits and their gradient": train_tokens * shape.vocab * 2 * _BF16,
    }, ("ppo_max_token_len_per_gpu",) if dynamic else ("ppo_micro_batch_size_per_gpu",))
    lp_tokens = max(_tokens(dynamic, spec.log_prob_max_token_len_per_gpu, micro, seq)
                    for micro in (spec.rollout_log_prob_micro_batch_size_per_gpu,
                                  spec.ref_log_prob_micro_batch_size_per_gpu))
    log_prob = Phase("log-prob", {
        "actor state": resident,
        "reference": ref,
        "gathered layers": gathered,
        "layer activations": lp_tokens * layer_values * _BF16,
        # bf16 logits and the fp32 log-softmax verl takes of them.
        "logits": lp_tokens * shape.vocab * (_BF16 + 4),
    }, ("log_prob_max_token_len_per_gpu",) if dynamic else
        ("rollout_log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu"))
    vllm = spec.gpu_memory_utilization * gpu_gb * GB
    rollout = Phase("rollout", {"actor state": resident, "reference": ref, "vLLM": vllm},
                    ("gpu_memory_utilization",))
    kv = vllm - params * _BF16 / spec.rollout_tensor_parallel_size - VLLM_NON_KV_GB * GB
    return MemoryEstimate(gpu_gb, (training, log_prob, rollout), kv / GB, seq)


def kv_bytes_per_token_per_gpu(shape: ModelShape, tp: int) -> float:
    """A token's KV cache on one GPU of a TP group (KV heads are split, or copied when fewer than tp)."""
    return shape.kv_bytes_per_token * max(shape.kv_heads // tp, 1) / shape.kv_heads


def has_reference(spec: GrpoSpec) -> bool:
    """verl builds the reference policy only for a KL loss or in-reward KL (main_ppo)."""
    in_reward = any(o.replace(" ", "").lower() == "algorithm.use_kl_in_reward=true" for o in spec.extra_overrides)
    return bool(spec.use_kl_loss) or in_reward


def for_run(spec: GrpoSpec, platform: Platform, model: str, nnodes: int) -> MemoryEstimate | None:
    """The run's estimate; None for a model not in MODELS."""
    shape = MODELS.get(model)
    if shape is None or not platform.gpu_memory_gb:
        return None
    return estimate(spec, shape, platform.gpu_memory_gb, platform.gpus_per_node * nnodes, has_reference(spec))


def summary_line(spec: GrpoSpec, platform: Platform, model: str, nnodes: int) -> str:
    est = for_run(spec, platform, model, nnodes)
    return est.line() if est else f"GPU memory estimate per GPU: not made ({model} is not in the model table)"


def problems(spec: GrpoSpec, platform: Platform, model: str, nnodes: int) -> list[tuple[tuple[str, ...], str]]:
    """(grpo fields, message) for each phase that would not fit the GPU with the margin."""
    est = for_run(spec, platform, model, nnodes)
    if est is None:
        return []
    shape = MODELS[model]
    out = []
    for phase in est.phases:
        if phase.total > est.limit_gb * GB:
            top = sorted(((k, v) for k, v in phase.parts.items() if v), key=lambda kv: -kv[1])[:3]
            why = ", ".join(f"{name} {value / GB:.0f}" for name, value in top)
            out.append((phase.keys, f"the {phase.name} phase needs ~{phase.total / GB:.0f} GB per GPU "
                        f"({why} GB) of the {platform.gpu_memory_gb} GB {platform.accelerator}, over the "
                        f"{est.limit_gb:.0f} GB limit ({MARGIN:.0%} margin): lower it or add GPU nodes"))
    tokens = est.kv_cache_gb * GB / kv_bytes_per_token_per_gpu(shape, spec.rollout_tensor_parallel_size)
    if tokens < est.sequence_len:
        out.append((("rollout_tensor_parallel_size", "gpu_memory_utilization"),
                    f"vLLM's KV cache (~{max(est.kv_cache_gb, 0):.0f} GB per GPU) holds {max(int(tokens), 0)} tokens, "
                    f"fewer than one sequence ({est.sequence_len}): vLLM refuses to start; raise either"))
    return out


def rollout_tp(platform: Platform, model: str, values: Mapping[str, Any], nnodes: int) -> int:
    """The smallest rollout tensor parallel size whose weight shard takes at most WEIGHT_SHARE_MAX of
    vLLM's budget and whose KV cache holds each replica's share of a whole rollout batch at full
    length (so the batch decodes without preemption): more replicas where memory allows. The
    platform's GPUs per node for a model not in MODELS.

    `values` are the grpo fields as given (strings from config, or defaults); unreadable ones count as
    their defaults here and are reported by their own field."""
    shape = MODELS.get(model)
    if shape is None or not platform.gpu_memory_gb:
        return platform.gpus_per_node
    util = _number(values.get("gpu_memory_utilization"), float, "gpu_memory_utilization")
    batch = _number(values.get("train_batch_size"), int, "train_batch_size")
    n = _number(values.get("rollout_n"), int, "rollout_n")
    seq = (_number(values.get("max_prompt_length"), int, "max_prompt_length")
           + _number(values.get("max_response_length"), int, "max_response_length"))
    n_gpus = platform.gpus_per_node * nnodes
    for tp in TP_CHOICES:
        if tp > platform.gpus_per_node:
            break
        budget, shard = util * platform.gpu_memory_gb * GB, shape.params * _BF16 / tp
        kv = budget - shard - VLLM_NON_KV_GB * GB
        share = batch * n * seq / max(n_gpus // tp, 1)
        if shard <= WEIGHT_SHARE_MAX * budget and kv >= share * kv_bytes_per_token_per_gpu(shape, tp):
            return tp
    return platform.gpus_per_node


def _number(value: Any, kind: type, field: str) -> Any:
    default = GrpoSpec.model_fields[field].default
    try:
        return kind(value) if value not in (None, "") else default
    except (TypeError, ValueError):
        return default


MERGE_BYTES_PER_PARAM = 8
"""verl's merger holds the fp32 model shards (4 bytes a parameter) and the merged copy beside them
(workloads/export_model.memory_needed: twice the shards)."""


def merge_memory_bytes(model: str) -> int | None:
    """Memory verl's merger needs for `model`'s checkpoint (Qwen2.5-32B: some 262 GB, a GPU worker node's);
    None for a model not in MODELS: the export then runs on the head, and refuses to start if it would not fit."""
    shape = MODELS.get(model)
    return shape.params * MERGE_BYTES_PER_PARAM if shape else None
