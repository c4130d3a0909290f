"""How long the GRPO run takes and what it costs, modeled before anything is paid for.

One colocated GRPO step is rollout (vLLM decode at peak x DECODE_SHARE / (2 x parameters) a GPU, plus
the response tail), log-probs (2 x parameters x tokens, actor and reference), the update ((6 + 2 with
gradient checkpointing) x parameters x tokens at the platform's peak bf16 x MFU) and STEP_OVERHEAD_S;
the run adds validations, verl's start-up and the checkpoints' GPU time (domain/checkpoint_time.py).
Every assumption is a named constant here but the dataset's (its rows and token lengths: its recipe in
domain/staged.py); a run's measured rates (domain/measured.py) replace them.
A model to plan with, not a measurement. Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.measured import Measured
from domain.pricing import PRICE_KEY
from domain.staged import Recipe

MFU: dict[str, float] = {"a3u": 0.40, "a4": 0.30, "a4x": 0.30, "g2": 0.20}
"""Share of the GPUs' dense bf16 peak the training passes reach, by platform: ~40% on H200 for FSDP2 in bf16 on
a 32B dense model; Blackwell's bf16 peak is 2.3-2.5x Hopper's but the same stack (no FP8, FSDP2 collectives,
attention kernels) reaches a smaller share of it: 30%; a 0.5B model on L4s with FSDP's collectives over TCP
keeps its GPUs busy a smaller share still: 20%. An assumption, to be replaced by measured steps."""
DECODE_SHARE = 0.20
"""Share of the GPUs' peak vLLM's decoding reaches at 2 FLOPs a parameter a token, with hundreds of sequences a
replica (max_num_seqs sized to the requests a replica gets): the decode rate."""
STEP_OVERHEAD_S = 10.0
"""Each step's fixed time besides the three passes: the weight sync from FSDP to vLLM, vLLM's wake-up and
sleep, the reward, advantages and scheduling."""
TAIL_TOKEN_S = 0.02
"""One decode iteration of a vLLM replica left with its last few (longest) responses: ~20 ms, its per-iteration
floor (scheduling, sampling, a forward over few sequences with CUDA graphs). An assumption, not measured."""
MODEL_LOAD_GBPS = 1.0
"""GB/s rank 0 reads the model's safetensors through the GCS FUSE mount into host memory, building the fp32
actor: the low end of what one reader gets from the mount (the checkpoints' bucket rate is 2 GB/s per node
written by many ranks). An assumption, not measured; the model is read once more for the reference policy."""
VERL_PROCESS_START_S = 60.0
"""From the job RUNNING to verl's workers ready: the driver's imports (torch, verl, vLLM), its placement group
and one Ray actor per GPU importing the same. An assumption, not measured."""
VLLM_START_S = 90.0
"""vLLM's engines start (dummy weights: verl syncs the actor's), profile memory and capture CUDA graphs
(verl's rollout default enforce_eager=False). An assumption, not measured."""
EXPORT_START_S = 60.0
"""The export's pod start before verl's merger reads the last checkpoint's fp32 model and writes the merged one
(workloads/export_model.py), both through the mount at MODEL_LOAD_GBPS. An assumption, not measured."""
FIRST_SYNC_S = 30.0
"""The first FSDP-to-vLLM weight sync and the buckets it builds, beyond each step's (STEP_OVERHEAD_S). An
assumption, not measured."""
ASSUMPTIONS = "  assumptions (domain/run_time.py)"
"""Starts the line naming the model's assumptions (a detail: synth shows it with --verbose)."""


@dataclass(frozen=True)
class Assumptions:
    """The model's assumptions, together; `for_platform` gives this module's, with a run's measured rates."""

    mfu: float
    prompt_tokens: int
    response_tokens: int
    """The dataset's mean response before data.max_response_length caps it."""
    decode_share: float = DECODE_SHARE
    step_overhead_s: float = STEP_OVERHEAD_S
    tail_token_s: float = TAIL_TOKEN_S
    model_load_gbps: float = MODEL_LOAD_GBPS
    measured: Measured | None = None
    """The run whose rates replace the assumed ones (model load, start-up, step), where it measured them."""
    tokens_from: str = "the dataset's, domain/staged.py"

    @classmethod
    def for_platform(cls, platform: str, recipe: Recipe, measured: Measured | None = None, *,
                     own_data: bool = False) -> Assumptions:
        """The platform's MFU, the dataset's token lengths (its recipe's, domain/staged.py; with `own_data`, the
        recipe's stand in: a dataDir's are not read offline), a run's measured rates."""
        load = measured.rates.model_load_gbps if measured else None
        return cls(mfu=MFU[platform], prompt_tokens=recipe.prompt_tokens, response_tokens=recipe.response_tokens,
                   model_load_gbps=load or MODEL_LOAD_GBPS, measured=measured,
                   **({"tokens_from": f"{recipe.repo}'s, assumed for verl-gke:dataDir"} if own_data else {}))

    def source(self, rate: float | None) -> str:
        """" (measured on run X)" beside a figure a run measured, "" beside an assumed one."""
        return f" ({self.measured.note})" if rate is not None and self.measured else ""


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
    max_response_tokens: int
    """data.max_response_length: the longest response the rollout waits for."""
    validation_prompts: int
    """The test split's rows (data.val_files), one greedy response each (verl's val_kwargs.n = 1)."""
    steps_at_most: bool = False
    """`steps` is an upper bound: data.filter_overlong_prompts drops prompts before the run."""
    validations: int = 0
    """Validation passes during the run (every test_freq steps and after the last), besides the one before it."""
    validate_first: bool = False
    """trainer.val_before_train: a validation pass before the first step (part of the start-up)."""
    model_loads: int = 1
    """Reads of the model through the mount at start-up: the actor's, the reference policy's, the critic's."""
    critic: bool = False
    """A critic (PPO, GAE): its value pass and its own update on every token, as large as the actor."""
    lora: bool = False
    """LoRA: the update's backward computes the activations' gradients but no base weight's (4, not 6, FLOPs a
    parameter a token, before recomputation)."""


@dataclass(frozen=True)
class RunTime:
    """The modeled step, its parts, and the run."""

    shape: RunShape
    assumptions: Assumptions
    rollout_s: float
    """Every response at the decode rate, the tail included."""
    log_prob_s: float
    update_s: float
    overhead_s: float
    tail_s: float
    """The part of rollout_s (and of each validation pass) spent on the longest responses."""
    validation_s: float
    """One validation pass."""
    startup_s: float
    """From the job RUNNING to verl's first training step."""

    @property
    def response_tokens(self) -> int:
        """The mean response the model counts: the dataset's, capped at data.max_response_length."""
        return min(self.assumptions.response_tokens, self.shape.max_response_tokens)

    @property
    def modeled_step_s(self) -> float:
        return self.rollout_s + self.log_prob_s + self.update_s + self.overhead_s

    @property
    def step_s(self) -> float:
        """The step: the measured one where a run measured it, else the modeled one."""
        measured = self.assumptions.measured
        return (measured.rates.step_seconds if measured and measured.rates.step_seconds else None) or self.modeled_step_s

    @property
    def verl_startup_s(self) -> float:
        """verl's start-up: the measured one where a run measured it, else the modeled one."""
        measured = self.assumptions.measured
        return (measured.rates.verl_startup_seconds if measured else None) or self.startup_s

    @property
    def export_s(self) -> float:
        """The export after the run: the fp32 model read and the merged model written through the mount."""
        return EXPORT_START_S + 2 * 4 * self.shape.params / (self.assumptions.model_load_gbps * 1e9)

    @property
    def decode_tokens_per_s(self) -> float:
        """The decode rate of one GPU."""
        return decode_rate(self.shape, self.assumptions)

    @property
    def run_s(self) -> float | None:
        """Every step and the checkpoints' GPU time; None when the steps are not known."""
        if self.shape.steps is None:
            return None
        return self.shape.steps * self.step_s + self.shape.validations * self.validation_s + self.shape.checkpoint_s

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
        measured_step = a.measured.rates.step_seconds if a.measured else None
        capped = (f": a mean of {a.response_tokens} capped at data.max_response_length"
                  if self.response_tokens < a.response_tokens else "")
        step = (f"step ~{self.step_s:.0f} s{a.source(measured_step)} (modeled {self.modeled_step_s:.0f}: rollout "
                f"{self.rollout_s:.0f} with a response tail of {self.tail_s:.0f}, log-probs {self.log_prob_s:.0f}, "
                f"update {self.update_s:.0f}, weight sync and overhead {self.overhead_s:.0f})")
        if self.run_s is None:
            run = "run time unknown (steps unknown)"
        else:
            saves = f" and checkpoints ({s.checkpoint_s:.0f} s)" if s.checkpoint_s else ""
            if s.validations:
                saves = f", {s.validations} validation passes ({self.validation_s:.0f} s each)" + saves
            cost = self.cost_usd(usd_per_hour)
            run = (f"{'at most ' if s.steps_at_most else ''}{s.steps} steps{saves} ~{self.run_s / 60:.0f} min, "
                   f"{self.gpu_hours:.1f} GPU-hours, "
                   + (f"~${cost:,.2f} at ${usd_per_hour:,.2f}/h" if cost is not None
                      else f"cost unknown (no price: set {PRICE_KEY})"))
        return [
            f"Modeled run: {step}; {run}",
            f"{ASSUMPTIONS}: training at {a.mfu:.0%} MFU of {s.peak_flops / 1e15:g} PFLOP/s bf16 "
            f"a GPU; {a.prompt_tokens + self.response_tokens} tokens a sequence ({a.prompt_tokens} prompt + "
            f"{self.response_tokens} response{capped}; {a.tokens_from}), {s.sequences} sequences a "
            f"step; decode ~{self.decode_tokens_per_s:,.0f} tokens/s a GPU ({a.decode_share:.0%} of peak); "
            f"responses up to {s.max_response_tokens} tokens, the "
            f"tail at {a.tail_token_s * 1000:g} ms an iteration; {s.validation_prompts} validation prompts a pass; "
            f"{a.step_overhead_s:g} s a step for weight sync and overhead; checkpoints as above "
            "(domain/checkpoint_time.py)",
        ]

    def startup_line(self) -> str:
        """verl's start-up, its parts and rates named (or the measured figure)."""
        a, s = self.assumptions, self.shape
        measured = a.measured.rates.verl_startup_seconds if a.measured else None
        if measured:
            return f"verl start-up {measured / 60:.1f} min{a.source(measured)} (modeled {self.startup_s / 60:.1f})"
        load = _bf16_bytes(s.params) / 1e9
        load_rate = a.measured.rates.model_load_gbps if a.measured else None
        val = f" + validation before training {self.validation_s:.0f} s" if s.validate_first else ""
        return (f"verl start-up {self.startup_s / 60:.1f} min: processes {VERL_PROCESS_START_S:g} s + the model "
                f"({load:.1f} GB bf16, read {s.model_loads}x) through GCS FUSE at {a.model_load_gbps:g} GB/s"
                f"{a.source(load_rate)} + vLLM start and CUDA graphs {VLLM_START_S:g} s + first weight sync "
                f"{FIRST_SYNC_S:g} s{val}")


def measured_ratio(measured_step_s: float, modeled_step_s: float) -> float:
    """A measured step over the modeled one (1.0: as modeled; 1.3: the run takes about 1.3x its modeled time)."""
    return measured_step_s / modeled_step_s


def decode_rate(shape: RunShape, assumptions: Assumptions) -> float:
    """Tokens one GPU decodes a second: its share of peak at 2 FLOPs a parameter a token."""
    return shape.peak_flops * assumptions.decode_share / (2 * shape.params)


def _bf16_bytes(params: int) -> int:
    """The model's safetensors as published (bf16): what start-up reads."""
    return 2 * params


def model(shape: RunShape, assumptions: Assumptions) -> RunTime:
    """The run's step and run time under `assumptions` (formulas in the module's docstring)."""
    a = assumptions
    response = min(a.response_tokens, shape.max_response_tokens)
    tokens = shape.sequences * (a.prompt_tokens + response)
    rate = shape.n_gpus * shape.peak_flops * a.mfu
    per_token = (4 if shape.lora else 6) + (2 if shape.recompute else 0)
    critic_update = (6 + (2 if shape.recompute else 0)) if shape.critic else 0
    update = (per_token + critic_update) * shape.params * tokens / rate
    log_prob = 2 * shape.params * tokens * (1 + (1 if shape.reference else 0) + (1 if shape.critic else 0)) / rate
    decode = shape.n_gpus * decode_rate(shape, a)
    tail = (shape.max_response_tokens - response) * a.tail_token_s
    rollout = shape.sequences * response / decode + tail
    validation = shape.validation_prompts * response / decode + tail
    startup = (VERL_PROCESS_START_S + _bf16_bytes(shape.params) * shape.model_loads / (a.model_load_gbps * 1e9)
               + VLLM_START_S + FIRST_SYNC_S + (validation if shape.validate_first else 0.0))
    return RunTime(shape, a, rollout, log_prob, update, a.step_overhead_s, tail, validation, startup)


def validation_passes(steps: int | None, test_freq: int) -> int:
    """verl's validations during a run of `steps`: every test_freq steps and after the last (none when
    test_freq <= 0); the one before training is val_before_train's."""
    if steps is None or test_freq <= 0:
        return 0
    return len(set(range(test_freq, steps + 1, test_freq)) | {steps})
