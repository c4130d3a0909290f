"""The GPU time a run's checkpoints cost: a pure model, its assumptions named here and nowhere else.

The GPUs wait for each save's local-disk write and, once at the end, for the copy of the last save's
model to the bucket (the optimizer state follows in the background, workloads/checkpoints.py). FSDP
spreads a checkpoint evenly over the ranks, so every node writes and copies its share at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from domain.measured import Measured
from domain.platforms import Platform

MODEL_BYTES_PER_PARAM = 4
"""The model's part of an FSDP checkpoint: fp32 weights (the `model_*` shards the export merges)."""
OPTIMIZER_BYTES_PER_PARAM = 8
"""AdamW's two fp32 moments (the `optim_*` shards), which only a resume reads."""
CHECKPOINT_BYTES_PER_PARAM = MODEL_BYTES_PER_PARAM + OPTIMIZER_BYTES_PER_PARAM
"""A whole checkpoint (Qwen2.5-32B's 32.8B parameters: ~393 GB, ~131 GB of it the model)."""
SAVE_GBPS_PER_RANK = 2.0
"""torch.save of one rank's shards into the node's page cache, ranks in parallel; assumed, not measured
by verl-gke (verl logs `timing_s/save_checkpoint` per step: the figure to check it against on GCP)."""
BUCKET_WRITE_GBPS = 2.0
"""GCS FUSE writes per node: the low end of the 2-5 GB/s range measured for the bucket mount."""
LINE_START = "checkpoint time:"
"""Starts the model's line (a detail: synth shows it with --verbose)."""
DIRTY_RATIO = 0.20
"""Linux's default vm.dirty_ratio (and per-cgroup writeback share): writes beyond it wait for the disk,
which the local rate above does not model."""


@dataclass(frozen=True)
class CheckpointTime:
    saves: int
    stall_per_save_s: float
    """GPUs waiting at each save: the local write (or, straight to the bucket, the whole copy)."""
    copy_per_save_s: float
    """The background copy of one save to the bucket, per node (all nodes at once)."""
    last_copy_s: float
    """The GPUs' wait at the end: the copy of the last save's model, per node."""
    local: bool
    fits_page_cache: bool
    """Each node's share fits Linux's dirty-page limit of the worker's memory, as the local rate assumes."""
    bucket_total_s: float
    """What the same saves cost straight to the bucket."""
    save_gbps: float = SAVE_GBPS_PER_RANK
    bucket_gbps: float = BUCKET_WRITE_GBPS
    measured: Measured | None = None
    """The run whose local-save and bucket rates replace the assumed ones, where it measured them."""

    def _rates(self) -> str:
        """The two rates, each "assumed" or "measured on run X"."""
        rates = self.measured.rates if self.measured else None

        def said(value: float, measured: float | None, what: str) -> str:
            return f"{value:g} GB/s {what} ({self.measured.note})" if measured and self.measured else \
                f"assumed {value:g} GB/s {what}"

        local = said(self.save_gbps, rates.local_save_gbps_per_rank if rates else None, "per rank into the page cache")
        bucket = said(self.bucket_gbps, rates.bucket_write_gbps if rates else None, "per node to the bucket")
        return f"{local}, {bucket}" if self.local else bucket

    @property
    def total_s(self) -> float:
        """GPU time lost to checkpoints: every save's stall, and the last model's copy where it runs after training."""
        return self.saves * self.stall_per_save_s + (self.last_copy_s if self.local and self.saves else 0.0)

    def share(self, run_s: float) -> float:
        """The checkpoints' part of a run whose training takes `run_s` without them."""
        return self.total_s / (run_s + self.total_s)

    def keeps_up(self, save_interval_s: float) -> bool:
        """A save's copy ends before the next save begins (else local disk fills with waiting saves)."""
        return not self.local or self.copy_per_save_s <= save_interval_s

    def line(self) -> str:
        if not self.local:
            return (f"{LINE_START} {self.saves} saves x {self.stall_per_save_s:.0f} s straight to the bucket = "
                    f"{self.total_s:.0f} s of GPU time; {self._rates()}")
        return (f"{LINE_START} {self.saves} saves x {self.stall_per_save_s:.0f} s to local disk + "
                f"{self.last_copy_s:.0f} s for the last save's model to the bucket ({MODEL_BYTES_PER_PARAM} of its "
                f"{CHECKPOINT_BYTES_PER_PARAM} bytes per parameter; the optimizer state follows in the background) = "
                f"{self.total_s:.0f} s of GPU time "
                f"(straight to the bucket: {self.bucket_total_s:.0f} s); {self._rates()}"
                + ("" if self.fits_page_cache else "; a node's share exceeds its page cache: expect longer saves"))


def checkpoint_time(platform: Platform, *, checkpoint_bytes: int, nodes: int, saves: int,
                    local: bool = True, measured: Measured | None = None) -> CheckpointTime:
    """The model for `saves` checkpoints of `checkpoint_bytes` (model and AdamW state) over `nodes` GPU nodes
    of `platform`, at a run's `measured` rates where it measured them."""
    rates = measured.rates if measured else None
    save_gbps = (rates.local_save_gbps_per_rank if rates else None) or SAVE_GBPS_PER_RANK
    bucket_gbps = (rates.bucket_write_gbps if rates else None) or BUCKET_WRITE_GBPS
    per_node_gb = checkpoint_bytes / nodes / 1e9
    copy_s = per_node_gb / bucket_gbps
    local_s = per_node_gb / (save_gbps * platform.gpus_per_node)
    page_cache_gb = DIRTY_RATIO * platform.worker_memory_gi * 2**30 / 1e9
    return CheckpointTime(saves=saves, stall_per_save_s=local_s if local else copy_s, copy_per_save_s=copy_s,
                          last_copy_s=copy_s * MODEL_BYTES_PER_PARAM / CHECKPOINT_BYTES_PER_PARAM, local=local,
                          fits_page_cache=per_node_gb <= page_cache_gb, bucket_total_s=saves * copy_s,
                          save_gbps=save_gbps, bucket_gbps=bucket_gbps, measured=measured)
