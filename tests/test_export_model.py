"""Model delivery: verl's own merger (from the pinned wheels) turns an FSDP checkpoint into a model that
transformers loads with the original's weights. The checkpoint is a tiny Qwen2 laid out as verl's
FSDPCheckpointManager lays it out for world size 1 (verl/utils/checkpoint/fsdp_checkpoint_manager.py):
`model_world_size_1_rank_0.pt` (the model's state dict), `fsdp_config.json` and `huggingface/`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from domain.platforms import VERL_0_6_1, VERL_0_9_0
from domain.verl_wheel import unpacked
from workloads import export_model
from workloads.export_model import ExportError


def save_tiny_tokenizer(folder: Path, scratch: Path) -> None:
    """A byte-level BPE tokenizer of 64 tokens: verl's manager saves the run's tokenizer beside the config."""
    from transformers import Qwen2Tokenizer

    vocab = scratch / "vocab.json"
    merges = scratch / "merges.txt"
    vocab.write_text(json.dumps({chr(ord("a") + i % 26) * (1 + i // 26): i for i in range(64)}))
    merges.write_text("#version: 0.2\n")
    Qwen2Tokenizer(vocab_file=str(vocab), merges_file=str(merges), unk_token=None, bos_token=None,
                   eos_token="a", pad_token="a").save_pretrained(folder)


def tiny_checkpoint(root: Path, step: int, seed: int):
    """A 2-layer Qwen2 (hidden 64) saved as verl's step `step` of a world-size-1 run; returns the model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, torch_dtype="float32")
    model = Qwen2ForCausalLM(config)
    # As a pretrained model's config, which verl's manager saves, names its class.
    model.config.architectures = ["Qwen2ForCausalLM"]
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    model.config.save_pretrained(actor / "huggingface")
    save_tiny_tokenizer(actor / "huggingface", root)
    (root / export_model.TRACKER).write_text(str(step))
    return model


@pytest.mark.parametrize("release", [VERL_0_6_1, VERL_0_9_0], ids=lambda r: r.version)
def test_verls_merger_delivers_a_model_transformers_loads_with_the_same_weights(tmp_path: Path, release) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    checkpoints = tmp_path / "checkpoints" / "run-1"
    tiny_checkpoint(checkpoints, step=5, seed=0)
    newest = tiny_checkpoint(checkpoints, step=10, seed=1)
    target = export_model.export(checkpoints, tmp_path / "run-1" / "model", verl_dir=unpacked(release),
                                 python=sys.executable, timeout_s=600)
    assert target == tmp_path / "run-1" / "model"
    assert not (tmp_path / "run-1" / "model.partial").exists()
    assert any(target.glob("*.safetensors"))
    # verl's merger saves bfloat16: the original's weights, rounded to it.
    loaded = AutoModelForCausalLM.from_pretrained(target, torch_dtype="auto")
    got, expected = loaded.state_dict(), newest.state_dict()
    assert sorted(got) == sorted(expected)
    assert {t.dtype for t in got.values()} == {torch.bfloat16}
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor.to(torch.bfloat16)), key


def test_a_missing_step_or_an_incomplete_checkpoint_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"latest_checkpointed_iteration.txt: no checkpoint yet"):
        export_model.export(tmp_path, tmp_path / "model")
    actor = tmp_path / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 2}))
    with pytest.raises(ExportError, match=r"incomplete checkpoint \(world size 2, missing "
                                          r"model_world_size_2_rank_0.pt, model_world_size_2_rank_1.pt\)"):
        export_model.export(tmp_path, tmp_path / "model", step=3)
    with pytest.raises(ExportError, match=r"no FSDP checkpoint at step 4 \(have: global_step_3\)"):
        export_model.export(tmp_path, tmp_path / "model", step=4)
