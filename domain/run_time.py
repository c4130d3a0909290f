"""How long the GRPO run takes and what it costs, modeled before anything is paid for.

One step of verl's GRPO on its colocated GPUs (the hybrid engine): vLLM generates every response (the
rollout), the actor (and the reference policy, when there is one) computes the log-probs of every token, the
actor updates on every token, and the new weights go back to vLLM. Each formula is a plain function of the
run's own numbers:

    tokens a step        T = sequences x (prompt + response tokens)
    update FLOPs         (6 + 2 with gradient checkpointing) x parameters x T     (forward, backward, recompute)
    log-prob FLOPs       2 x parameters x T, once for the actor and once for the reference policy
    training seconds     FLOPs / (GPUs x peak bf16 FLOP/s x MFU)
    rollout seconds      sequences x response tokens / (GPUs x decode rate);
                         decode rate a GPU = peak x DECODE_SHARE / (2 x parameters)
    step seconds         rollout + log-probs + update + STEP_OVERHEAD_S
    run seconds          steps x step + the GPU time the checkpoints cost (domain/checkpoint_time.py)

Every assumption of the step is here, named once; the checkpoints' are in domain/checkpoint_time.py, the
GPUs' peak FLOP/s platform facts (domain/platforms.py). The figures are a model to plan with, not a
measurement: `measured_ratio` holds a measured step against it.
Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.pricing import PRICE_KEY

MFU: dict[str, float] = {"a3u": 0.40, "a4": 0.30, "a4x": 0.30}
"""Share of the GPUs' dense bf16 peak the training passes reach, by platform: ~40% on H200 for FSDP2 in bf16 on
a 32B dense model; Blackwell's bf16 peak is 2.3-2.5x Hopper's but the same stack (no FP8, FSDP2 collectives,
attention kernels) reaches a smaller share of it: 30%. An assumption, to be replaced by measured steps."""
PROMPT_TOKENS = 128
"""Mean prompt of a GSM8K sequence: the question (~70 tokens), verl's instruction to reason step by step and
the chat template's system prompt and markers."""
RESPONSE_TOKENS = 320
"""Mean response of Qwen2.5-32B-Instruct reasoning through a GSM8K problem (max_response_length caps it)."""
DECODE_SHARE = 0.20
"""Share of the GPUs' peak vLLM's decoding reaches at 2 FLOPs a parameter a token, with hundreds of sequences a
replica (max_num_seqs sized to the requests a replica gets): the decode rate."""
STEP_OVERHEAD_S = 10.0
"""Each step's fixed time besides the three passes: the weight sync from FSDP to vLLM, vLLM's wake-up and
sleep, the reward, advantages and scheduling."""
ASSUMPTIONS = "  assumptions (domain/run_time.py)"
"""Starts the line naming the model's assumptions (a detail: synth shows it with --verbose)."""


@dataclass(frozen=True)
class Assumptions:
    """The model's assumptions, together; `for_platform` gives this module's."""

    mfu: float
    prompt_tokens: int = PROMPT_TOKENS
    response_tokens: int = RESPONSE_TOKENS
    decode_share: float = DECODE_SHARE
    step_overhead_s: float = STEP_OVERHEAD_S

    @classmethod
    def for_platform(cls, platform: str) -> Assumptions:
        return cls(mfu=MFU[platform])


@dataclass(frozen=True)
class RunShape:
    """The run's own numbers the model reads."""

    params: int
    sequences: int
    """Sequences a step: train_batch_size x rollout.n."""
    n_gpus: int
    peak_flops: float
    """Dense bf16 FLOP/s of one GPU."""
    reference: bool
    """A reference policy's log-prob pass (KL loss or in-reward KL)."""
    recompute: bool
    """Gradient checkpointing: the update recomputes each layer's forward."""
    steps: int | None
    checkpoint_s: float
    """GPU time all the run's checkpoints cost (domain/checkpoint_time.py's total)."""


@dataclass(frozen=True)
class RunTime:
    """The modeled step, its parts, and the run."""

    shape: RunShape
    assumptions: Assumptions
    rollout_s: float
    log_prob_s: float
    update_s: float
    overhead_s: float

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.log_prob_s + self.update_s + self.overhead_s

    @property
    def decode_tokens_per_s(self) -> float:
        """The decode rate of one GPU."""
        return decode_rate(self.shape, self.assumptions)

    @property
    def run_s(self) -> float | None:
        """Every step and the checkpoints' GPU time; None when the steps are not known."""
        if self.shape.steps is None:
            return None
        return self.shape.steps * self.step_s + self.shape.checkpoint_s

    @property
    def gpu_hours(self) -> float | None:
        return None if self.run_s is None else self.run_s / 3600 * self.shape.n_gpus

    def cost_usd(self, usd_per_hour: float | None) -> float | None:
        """The run at the stack's price per hour (every node, not the GPUs alone); None if either is unknown."""
        if self.run_s is None or usd_per_hour is None:
            return None
        return round(self.run_s / 3600 * usd_per_hour, 2)

    def lines(self, usd_per_hour: float | None) -> list[str]:
        """The model as synth and `pulumi up` print it, its assumptions named."""
        a, s = self.assumptions, self.shape
        step = (f"step ~{self.step_s:.0f} s (rollout {self.rollout_s:.0f}, log-probs {self.log_prob_s:.0f}, update "
                f"{self.update_s:.0f}, weight sync and overhead {self.overhead_s:.0f})")
        if self.run_s is None:
            run = "run time unknown (steps unknown)"
        else:
            saves = f" and checkpoints ({s.checkpoint_s:.0f} s)" if s.checkpoint_s else ""
            cost = self.cost_usd(usd_per_hour)
            run = (f"{s.steps} steps{saves} ~{self.run_s / 60:.0f} min, {self.gpu_hours:.1f} GPU-hours, "
                   + (f"~${cost:,.2f} at ${usd_per_hour:,.2f}/h" if cost is not None
                      else f"cost unknown (no price: set {PRICE_KEY})"))
        return [
            f"Modeled run: {step}; {run}",
            f"{ASSUMPTIONS}: training at {a.mfu:.0%} MFU of {s.peak_flops / 1e15:g} PFLOP/s bf16 "
            f"a GPU; {a.prompt_tokens + a.response_tokens} tokens a sequence ({a.prompt_tokens} prompt + "
            f"{a.response_tokens} response), {s.sequences} sequences a step; decode ~{self.decode_tokens_per_s:,.0f} "
            f"tokens/s a GPU ({a.decode_share:.0%} of peak); {a.step_overhead_s:g} s a step for weight sync and "
            "overhead; checkpoints as above (domain/checkpoint_time.py)",
        ]


def measured_ratio(measured_step_s: float, modeled_step_s: float) -> float:
    """A measured step over the modeled one (1.0: as modeled; 1.3: the run takes about 1.3x its modeled time)."""
    return measured_step_s / modeled_step_s


def decode_rate(shape: RunShape, assumptions: Assumptions) -> float:
    """Tokens one GPU decodes a second: its share of peak at 2 FLOPs a parameter a token."""
    return shape.peak_flops * assumptions.decode_share / (2 * shape.params)


def model(shape: RunShape, assumptions: Assumptions) -> RunTime:
    """The run's step and run time under `assumptions` (formulas in the module's docstring)."""
    a = assumptions
    tokens = shape.sequences * (a.prompt_tokens + a.response_tokens)
    rate = shape.n_gpus * shape.peak_flops * a.mfu
    update = (6 + (2 if shape.recompute else 0)) * shape.params * tokens / rate
    log_prob = 2 * shape.params * tokens * (2 if shape.reference else 1) / rate
    rollout = shape.sequences * a.response_tokens / (shape.n_gpus * decode_rate(shape, a))
    return RunTime(shape, a, rollout, log_prob, update, a.step_overhead_s)
