"""The modeled checkpoint time per platform (domain/checkpoint_time.py), against hand calculations.

The run: Qwen2.5-32B (verl-gke's size estimate 32e9 parameters x 12 bytes = 384 GB per checkpoint), 4 GPU
nodes, 58 steps, a save every 10 steps and after the last: 6 saves; a third of each (4 of the 12 bytes per
parameter, the fp32 weights) is the model, the rest AdamW's moments. Run times from the step times the
run-time review measured per GPU (H200 65-75 s, B200 40-45 s, GB200 40-50 s; the middle of each)."""

from __future__ import annotations

import pytest

from domain.checkpoint_time import (
    BUCKET_WRITE_GBPS,
    CHECKPOINT_BYTES_PER_PARAM,
    MODEL_BYTES_PER_PARAM,
    SAVE_GBPS_PER_RANK,
    checkpoint_time,
)
from domain.measured import Measured, Rates
from domain.platforms import PLATFORMS

CKPT = 384 * 10**9
RUN_S = {"a4": 58 * 42.5, "a3u": 58 * 70.0, "a4x": 58 * 45.0}


def test_the_assumptions_are_the_stated_ones() -> None:
    assert (SAVE_GBPS_PER_RANK, BUCKET_WRITE_GBPS) == (2.0, 2.0)
    assert (MODEL_BYTES_PER_PARAM, CHECKPOINT_BYTES_PER_PARAM) == (4, 12)


@pytest.mark.parametrize(("platform", "stall_s", "total_s"), [
    # 96 GB per node; 8 ranks x 2 GB/s = 16 GB/s -> 6 s a save; x 6 = 36 s; a save's copy 96 / 2 = 48 s,
    # of which the GPUs wait, once, for the last save's model: 32 GB / 2 = 16 s.
    ("a4", 6.0, 52.0),
    ("a3u", 6.0, 52.0),
    # 4 ranks x 2 GB/s = 8 GB/s -> 12 s a save; x 6 = 72 s; + 16 s.
    ("a4x", 12.0, 88.0),
])
def test_local_saves_cost_the_gpus_the_local_write_and_the_last_models_copy(platform: str, stall_s: float,
                                                                            total_s: float) -> None:
    t = checkpoint_time(PLATFORMS[platform], checkpoint_bytes=CKPT, nodes=4, saves=6)
    assert (t.stall_per_save_s, t.copy_per_save_s, t.last_copy_s, t.total_s) == (stall_s, 48.0, 16.0, total_s)


def test_saves_straight_to_the_bucket_cost_the_gpus_the_whole_copy_every_time() -> None:
    t = checkpoint_time(PLATFORMS["a4"], checkpoint_bytes=CKPT, nodes=4, saves=6, local=False)
    assert (t.stall_per_save_s, t.total_s) == (48.0, 288.0)  # 96 GB / 2 GB/s, x 6


@pytest.mark.parametrize(("platform", "share", "bucket_share"), [
    ("a4", 52 / (2465 + 52), 288 / (2465 + 288)),       # 2.1 % against 10.5 %
    ("a3u", 52 / (4060 + 52), 288 / (4060 + 288)),      # 1.3 % against 6.6 %
    ("a4x", 88 / (2610 + 88), 288 / (2610 + 288)),      # 3.3 % against 9.9 %
])
def test_checkpoints_take_at_most_5_percent_of_the_modeled_run(platform: str, share: float,
                                                               bucket_share: float) -> None:
    local = checkpoint_time(PLATFORMS[platform], checkpoint_bytes=CKPT, nodes=4, saves=6)
    bucket = checkpoint_time(PLATFORMS[platform], checkpoint_bytes=CKPT, nodes=4, saves=6, local=False)
    assert local.share(RUN_S[platform]) == pytest.approx(share)
    assert bucket.share(RUN_S[platform]) == pytest.approx(bucket_share)
    assert local.share(RUN_S[platform]) <= 0.05 < bucket.share(RUN_S[platform])


def test_the_copy_must_keep_up_with_the_saves() -> None:
    """The next save must not find the last one still copying: 48 s of copy against 10 steps of 42.5 s."""
    t = checkpoint_time(PLATFORMS["a4"], checkpoint_bytes=CKPT, nodes=4, saves=6)
    assert t.keeps_up(save_interval_s=10 * 42.5) and not t.keeps_up(save_interval_s=40.0)


def test_a_save_larger_than_the_page_cache_share_is_said_not_to_fit() -> None:
    """The local rate assumes the save lands in the page cache (Linux's default dirty limit, 20% of the
    worker's memory); 1 node holding a whole 384 GB checkpoint on A4X (~770 GiB worker) does not."""
    assert checkpoint_time(PLATFORMS["a4x"], checkpoint_bytes=CKPT, nodes=4, saves=6).fits_page_cache
    assert not checkpoint_time(PLATFORMS["a4x"], checkpoint_bytes=CKPT, nodes=1, saves=6).fits_page_cache


def test_a_line_names_the_figures_and_the_assumptions() -> None:
    t = checkpoint_time(PLATFORMS["a4"], checkpoint_bytes=CKPT, nodes=4, saves=6)
    assert t.line() == ("checkpoint time: 6 saves x 6 s to local disk + 16 s for the last save's model to the bucket "
                        "(4 of its 12 bytes per parameter; the optimizer state follows in the background) = 52 s of "
                        "GPU time (straight to the bucket: 288 s); assumed 2 GB/s per rank into the page cache, "
                        "assumed 2 GB/s per node to the bucket")


@pytest.mark.parametrize(("platform", "share"), [
    # The default A4 and A3 Ultra stacks: 2 nodes, 192 GB each (64 GB of it the model): 6 x 192 / 16 = 72 s
    # + the last model 64 / 2 = 32 s = 104 s (waiting for the whole last copy: 72 + 96 = 168 s, 6.4 % on A4;
    # straight to the bucket: 6 x 96 = 576 s).
    ("a4", 104 / (2465 + 104)),    # 4.0 %: within the 5 % target at the bucket rate's low end
    ("a3u", 104 / (4060 + 104)),   # 2.5 %
])
def test_the_default_two_node_stacks(platform: str, share: float) -> None:
    t = checkpoint_time(PLATFORMS[platform], checkpoint_bytes=CKPT, nodes=2, saves=6)
    assert (t.total_s, t.last_copy_s, t.copy_per_save_s, t.bucket_total_s) == (104.0, 32.0, 96.0, 576.0)
    assert t.share(RUN_S[platform]) == pytest.approx(share) and t.share(RUN_S[platform]) <= 0.05



def test_measured_rates_replace_the_assumed_ones_and_say_so() -> None:
    measured = Measured.model_validate({"run": "run-7", "stack": "a4", "measuredAt": "2026-12-07T12:00:00+01:00",
                                        "rates": {"localSaveGBpsPerRank": 4.0, "bucketWriteGBps": 1.0}})
    t = checkpoint_time(PLATFORMS["a4"], checkpoint_bytes=CKPT, nodes=4, saves=6, measured=measured)
    # 96 GB per node: 8 ranks x 4 GB/s = 32 GB/s -> 3 s a save; the last model's 32 GB at 1 GB/s: 32 s.
    assert (t.stall_per_save_s, t.last_copy_s, t.total_s) == (3.0, 32.0, 50.0)
    assert t.line().endswith("4 GB/s per rank into the page cache (measured on run run-7), 1 GB/s per node to the "
                             "bucket (measured on run run-7)")
    only_bucket = measured.model_copy(update={"rates": Rates(bucket_write_gbps=1.0)})
    t = checkpoint_time(PLATFORMS["a4"], checkpoint_bytes=CKPT, nodes=4, saves=6, measured=only_bucket)
    assert t.stall_per_save_s == 6.0
    assert t.line().endswith("assumed 2 GB/s per rank into the page cache, 1 GB/s per node to the bucket "
                             "(measured on run run-7)")
