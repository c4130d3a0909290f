"""verl's settings by verl's names: `verl-gke:verl`, checked against the pinned verl's composed config;
the grpo* keys it replaced refused with their new form; `${` refused in every value that reaches verl."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from domain import grpo_spec, reward_fn
from domain.bucket import bucket_path, ray_writable_prefixes
from domain.config import ConfigError, load_config
from domain.grpo_spec import CHECKPOINT_LAUNCHER, RENAMED, entrypoint
from domain.stack_files import raw_config
from domain.stack_run import stack_run
from tests.conftest import BASE_CONFIG, verl_value
from verl_gke import synth

A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
KEY = "verl-gke:verl"


def cfg_with(paths: dict[str, Any] | str, **config: str):
    value = paths if isinstance(paths, str) else verl_value(paths)
    return load_config({**BASE_CONFIG, KEY: value, **config})


def refused(paths: dict[str, Any] | str, **config: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        cfg_with(paths, **config)
    return caught.value.problems


def job_args(cfg) -> list[str]:
    words = shlex.split(entrypoint(cfg.verl))
    assert words[:7] == [*CHECKPOINT_LAUNCHER, "python3", "-m", "verl.trainer.main_ppo"]
    return words[7:]


def test_a_verl_path_sets_verls_own_key_on_the_jobs_command_line() -> None:
    # `pulumi config set --path verl-gke:verl.data.train_batch_size 128` (and the mini batch with it).
    cfg = cfg_with({"data.train_batch_size": 128, A + "ppo_mini_batch_size": 128})
    assert "data.train_batch_size=128" in job_args(cfg)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=128" in job_args(cfg)
    assert cfg.verl.given == {"data.train_batch_size", A + "ppo_mini_batch_size"}


def test_values_as_the_cli_stores_them_are_read_as_the_types_verl_declares() -> None:
    # `--path` stores true/false as booleans, integers as numbers and the rest as strings (pulumi config set --help).
    cfg = cfg_with('{"actor_rollout_ref": {"actor": {"optim": {"lr": "2e-5"}, "use_kl_loss": true},'
                   ' "rollout": {"gpu_memory_utilization": "0.5"}}, "trainer": {"experiment_name": 2024}}')
    get = cfg.verl.get
    assert (get(A + "optim.lr"), get(A + "use_kl_loss"), get(R + "gpu_memory_utilization")) == (2e-5, True, 0.5)
    assert get("trainer.experiment_name") == "2024"  # verl's is a string: the CLI's number is its text
    assert {"actor_rollout_ref.actor.optim.lr=2e-05", "trainer.experiment_name='2024'"} <= set(job_args(cfg))


def test_nested_and_dotted_keys_are_the_same_path_and_may_be_set_once() -> None:
    dotted = cfg_with('{"data.train_batch_size": 512}')
    assert dotted.verl.get("data.train_batch_size") == 512
    assert refused('{"data.max_prompt_length": 256, "data": {"max_prompt_length": 128}}') == [
        "verl-gke:verl.data.max_prompt_length = 128: is set twice (nested and dotted); set it once."]


def test_a_path_verl_lacks_is_refused_with_the_nearest_one_it_has() -> None:
    assert refused({"data.train_batch_sise": 128, "actor.ppo_mini_batch_size": 64, "trainer.colour": "red"}) == [
        "verl-gke:verl.data.train_batch_sise = 128: verl 0.6.1's config has no data.train_batch_sise; did you mean "
        "data.train_batch_size?",
        "verl-gke:verl.actor.ppo_mini_batch_size = 64: verl 0.6.1's config has no actor.ppo_mini_batch_size; did you "
        "mean actor_rollout_ref.actor.ppo_mini_batch_size?",
        'verl-gke:verl.trainer.colour = "red": verl 0.6.1\'s config has no trainer.colour',
    ]


def test_every_wrong_type_is_named_at_once_with_what_verl_takes() -> None:
    assert refused({"data.train_batch_size": "lots", A + "use_dynamic_bsz": "yes", A + "optim.lr": [1],
                    "data.train_files": ["/data/a.parquet"], A + "ppo_micro_batch_size_per_gpu": 2.5,
                    "trainer.logger": True}) == [
        'verl-gke:verl.data.train_batch_size = "lots": must be a whole number (verl 0.6.1\'s default: 1024).',
        'verl-gke:verl.data.train_files = ["/data/a.parquet"]: must be a string (verl 0.6.1\'s default: '
        '"~/data/rlhf/gsm8k/train.parquet").',
        'verl-gke:verl.actor_rollout_ref.actor.use_dynamic_bsz = "yes": must be true or false (verl 0.6.1\'s '
        "default: false).",
        "verl-gke:verl.actor_rollout_ref.actor.optim.lr = [1]: must be a number (verl 0.6.1's default: 1e-06).",
        # verl's dataclass declares Optional[int] (its YAML default is null).
        "verl-gke:verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 2.5: must be a whole number or null "
        "(verl 0.6.1's default: null).",
        'verl-gke:verl.trainer.logger = true: must be a string or a list (verl 0.6.1\'s default: ["console", "wandb"]).',
    ]


def test_the_dataclass_behind_a_node_decides_its_type_not_the_yaml_default() -> None:
    # entropy_coeff is `0` in verl's YAML and `float` in ActorConfig: 0.01 is a value verl takes.
    assert cfg_with({A + "entropy_coeff": 0.01}).verl.get(A + "entropy_coeff") == 0.01
    assert cfg_with({A + "entropy_coeff": 0.01}, **{"verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"}).verl.get(
        A + "entropy_coeff") == 0.01


def test_sizes_the_rules_divide_by_must_be_positive_and_the_memory_share_a_share() -> None:
    assert refused({R + "tensor_model_parallel_size": 0, A + "ppo_max_token_len_per_gpu": -1,
                    R + "gpu_memory_utilization": 1.5, A + "ppo_micro_batch_size_per_gpu": 0}) == [
        "verl-gke:verl.actor_rollout_ref.rollout.tensor_model_parallel_size = 0: must be at least 1.",
        "verl-gke:verl.actor_rollout_ref.rollout.gpu_memory_utilization = 1.5: must be greater than 0 and at most 1 "
        "(a share of the GPU's memory).",
        "verl-gke:verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = -1: must be at least 1.",
        "verl-gke:verl.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 0: must be at least 1, or null.",
    ]
    assert cfg_with({A + "ppo_micro_batch_size_per_gpu": None}).verl.get(A + "ppo_micro_batch_size_per_gpu") is None


@pytest.mark.parametrize(("path", "why"), sorted(grpo_spec.OWNED.items()))
def test_paths_verl_gke_sets_itself_are_refused_with_the_key_to_set(path: str, why: str) -> None:
    assert refused({path: "x"}) == [f'verl-gke:verl.{path} = "x": {why}']


@pytest.mark.parametrize("value", ['"a string"', "[1, 2]", "{not json"])
def test_a_value_that_is_not_a_map_is_refused(value: str) -> None:
    [line] = refused(value)
    assert line == (f"verl-gke:verl = {json.dumps(value)}: must be a map (Pulumi's object type: a YAML mapping in the "
                    "stack file; one entry is set with `pulumi config set --path <key>.<name> <value>`).")


def test_a_verl_path_set_without_path_flag_is_refused_with_the_command() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, "verl-gke:verl.data.train_batch_size": "128"})
    assert caught.value.problems == [
        "verl-gke:verl.data.train_batch_size: a verl path is set inside verl-gke:verl: `pulumi config rm "
        "verl-gke:verl.data.train_batch_size`, then `pulumi config set --path verl-gke:verl.data.train_batch_size 128`"]


# Each of verl-gke 0.5's grpo* keys, a value a user may have set, and the line that names its new form.
OLD_KEYS = {
    "grpoTrainBatchSize": ("128", "replaced by verl-gke:verl.data.train_batch_size: `pulumi config rm "
                           "verl-gke:grpoTrainBatchSize`, then `pulumi config set --path "
                           "verl-gke:verl.data.train_batch_size 128`"),
    "grpoMaxCheckpoints": ("3", "replaced by verl-gke:verl.trainer.max_actor_ckpt_to_keep and "
                           "verl-gke:verl.trainer.max_critic_ckpt_to_keep: `pulumi config rm verl-gke:grpoMaxCheckpoints`, "
                           "then `pulumi config set --path verl-gke:verl.trainer.max_actor_ckpt_to_keep 3`, then `pulumi "
                           "config set --path verl-gke:verl.trainer.max_critic_ckpt_to_keep 3`"),
    "grpoUseKlLoss": ("auto", "replaced by verl-gke:verl.actor_rollout_ref.actor.use_kl_loss; unset means the "
                      "platform's default: `pulumi config rm verl-gke:grpoUseKlLoss`"),
    "grpoCheckpointDir": ("/data/my runs", "replaced by verl-gke:verl.trainer.default_local_dir: `pulumi config rm "
                          "verl-gke:grpoCheckpointDir`, then `pulumi config set --path "
                          "verl-gke:verl.trainer.default_local_dir '/data/my runs'`"),
    "grpoExtraOverrides": ('["trainer.project_name=gsm8k", "+trainer.tag=a b"]',
                           "replaced by verl-gke:verl.<verl path>, one per override: `pulumi config rm "
                           "verl-gke:grpoExtraOverrides`, then `pulumi config set --path "
                           "verl-gke:verl.trainer.project_name gsm8k`, then `pulumi config set --path "
                           "verl-gke:verl.trainer.tag 'a b'`"),
}


def test_each_of_the_29_grpo_keys_is_refused_with_one_line_naming_its_new_form() -> None:
    assert len(RENAMED) == 29
    raw = {**BASE_CONFIG, **{f"verl-gke:{key}": "7" for key in RENAMED}}
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert len(caught.value.problems) == 29
    for key, line in zip(RENAMED, caught.value.problems):
        new = [f"verl-gke:verl.{path}" for path in RENAMED[key]] or ["verl-gke:verl.<verl path>"]
        assert line.startswith(f'verl-gke:{key} = "7": replaced by {" and ".join(new)}'), line


@pytest.mark.parametrize("key", sorted(OLD_KEYS))
def test_an_old_key_names_the_commands_that_move_its_value(key: str) -> None:
    value, message = OLD_KEYS[key]
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, f"verl-gke:{key}": value})
    shown = json.loads(value) if value.startswith("[") else value
    assert caught.value.problems == [f"verl-gke:{key} = {json.dumps(shown)}: {message}"]


def test_every_new_form_is_a_path_of_each_pinned_verls_config() -> None:
    from domain.platforms import PLATFORMS
    from domain.verl_settings import is_known

    for release in {p.verl for p in PLATFORMS.values()}:
        assert [p for paths in RENAMED.values() for p in paths if not is_known(release, p)] == []


def test_the_defaults_of_the_stacks_keep_0_5_1s_run_ids() -> None:
    """An unchanged A4 or A3 Ultra stack resumes its run after the upgrade: the same id, the same folder. A4X's
    changes: its update token budget is now a whole mini-batch share (one micro-batch, no unsharded gradient)."""
    ids = {stack: stack_run(load_config(raw_config(stack)[0]))[0] for stack in ("a4", "a4-standard", "a3u-standard")}
    assert ids == {"a4": "run-632c7d78917f", "a4-standard": "run-632c7d78917f", "a3u-standard": "run-632c7d78917f"}
    assert stack_run(load_config(raw_config("a4x")[0]))[0] != "run-9207001fb3ed"


def test_a_label_or_the_request_cap_leaves_the_run_id_alone_and_a_math_key_changes_it() -> None:
    base = stack_run(load_config(BASE_CONFIG))[0]
    assert stack_run(cfg_with({"trainer.project_name": "mine", R + "max_num_seqs": 1024}))[0] == base
    assert stack_run(cfg_with({A + "optim.lr": 2e-5}))[0] != base


# Issue 40 item 4: no string that reaches verl or the job may hold a Hydra interpolation.
@pytest.mark.parametrize("paths", [
    {"trainer.default_local_dir": "/data/${oc.env:HF_TOKEN}"},
    {"trainer.logger": ["console", "${oc.env:HF_TOKEN}"]},
    {"trainer.project_name": "${trainer.experiment_name}"},
    {"actor_rollout_ref.model.path": "/data/${oc.env:HOME,x}"},
    {R + "engine_kwargs.vllm.${oc.env:HF_TOKEN}": 1},
])
def test_an_interpolation_anywhere_in_verl_settings_is_refused_naming_the_key(paths: dict[str, Any]) -> None:
    [(path, value)] = paths.items()
    assert refused(paths) == [
        f"verl-gke:verl.{path} = {json.dumps(value)}: no Hydra/OmegaConf interpolation (${{...}}): it would be "
        "resolved where the config is read (${oc.env:...} reads that machine's environment). Write the value itself."]


def test_synth_never_resolves_or_prints_an_environment_variable(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_GKE_CANARY", "canary-value-never-printed")
    value = verl_value({"trainer.default_local_dir": "/data/${oc.env:VERL_GKE_CANARY}",
                        "trainer.logger": "${oc.env:VERL_GKE_CANARY}"})
    assert synth.main(["a4", "--out", str(tmp_path), "--set", f"{KEY}={value}"]) == 2
    out, err = capsys.readouterr()
    assert "canary-value-never-printed" not in out + err
    assert err.count("no Hydra/OmegaConf interpolation") == 2 and "Traceback" not in err


# --- settings verl's config takes but the stack cannot run (issue 49, item 4) --------------------------------

def test_settings_the_stack_cannot_run_are_refused_at_synth_one_line_each_all_at_once() -> None:
    assert refused({R + "name": "sglang", A + "strategy": "megatron", "actor_rollout_ref.model.lora_rank": 1024}) == [
        'verl-gke:verl.actor_rollout_ref.rollout.name = "sglang": verlai/verl:vllm011.dev7 holds vLLM only; use '
        '"vllm".',
        'verl-gke:verl.actor_rollout_ref.actor.strategy = "megatron": verl-gke runs verl\'s FSDP workers only; use '
        '"fsdp2" or "fsdp".',
        "verl-gke:verl.actor_rollout_ref.model.lora_rank = 1024: at most 512: vLLM serves LoRA adapters up to that "
        "rank and refuses to start with a larger one.",
    ]


def test_a_critic_runs_from_the_actors_model_unless_set_and_only_from_the_bucket_on_fsdp() -> None:
    assert cfg_with({"critic.enable": True}).verl.get("critic.model.path") == "/data/Qwen2.5-32B-Instruct"
    assert cfg_with({"algorithm.adv_estimator": "grpo"}).verl.get("critic.model.path") == "~/models/deepseek-llm-7b-chat"
    assert refused({"algorithm.adv_estimator": "gae", "critic.model.path": "/home/me/critic",
                    "critic.strategy": "megatron"}) == [
        'verl-gke:verl.critic.model.path = "/home/me/critic": the critic\'s model must be under the bucket mount /data/ '
        "that every node shares (unset, verl-gke starts the critic from the actor's model).",
        'verl-gke:verl.critic.strategy = "megatron": verl-gke runs verl\'s FSDP workers only; use "fsdp2" or "fsdp".']


def test_dynamic_sampling_is_refused_on_a4x_with_a_budget_only(tmp_path: Path) -> None:
    a4x = {"verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"}
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return {\"score\": 1.0, \"acc\": 1.0}\n")
    dapo = {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc"}
    assert cfg_with(dapo, **a4x, **{reward_fn.KEY: str(reward)}).verl.get("algorithm.filter_groups.enable")
    assert refused({"algorithm.filter_groups.enable": True}, **a4x) == [
        "verl-gke:verl.algorithm.filter_groups.enable = true: dynamic sampling filters groups by a metric your reward "
        "function reports: set algorithm.filter_groups.metric (such as \"acc\") and a custom_reward_function that "
        "returns {\"score\": ..., \"acc\": ...} (the built-in GSM8K reward returns a bare number)."]
    assert refused({"algorithm.filter_groups.enable": True}, **a4x, **{"verl-gke:runBudgetHours": "5"}) == [
        "verl-gke:verl.algorithm.filter_groups.enable = true: verl 0.9.0's legacy trainer (trainer.use_v1 false, "
        "which runBudgetHours needs) never reads it; drop the budget or the dynamic sampling."]


def test_the_reference_policy_on_megatron_is_refused_too() -> None:
    assert refused({"actor_rollout_ref.ref.strategy": "megatron"}) == [
        'verl-gke:verl.actor_rollout_ref.ref.strategy = "megatron": verl-gke runs verl\'s FSDP workers only; use '
        '"fsdp2" or "fsdp".']


def test_a_rollout_tp_larger_than_a_node_is_refused() -> None:
    # 2 nodes x 8 GPUs: TP 16 divides the 16 GPUs, but a vLLM replica's GPUs must share a node's NVLink.
    assert refused({R + "tensor_model_parallel_size": 16}) == [
        "verl-gke:verl.actor_rollout_ref.rollout.tensor_model_parallel_size = 16: a vLLM replica runs within one node: "
        "at most the 8 GPUs per node."]


def test_a_rollout_tp_that_does_not_divide_the_models_attention_heads_is_refused() -> None:
    # Qwen2.5-7B-Instruct: 28 heads (hidden 3584 / head_dim 128); vLLM refuses TP 8 ("Total number of attention
    # heads (28) must be divisible by tensor parallel size (8)").
    assert refused({R + "tensor_model_parallel_size": 8}, **{"verl-gke:model": "Qwen/Qwen2.5-7B-Instruct",
                                                              "verl-gke:modelRevision": "a" * 40}) == [
        "verl-gke:verl.actor_rollout_ref.rollout.tensor_model_parallel_size = 8: must divide "
        "Qwen/Qwen2.5-7B-Instruct's 28 attention heads (vLLM splits them across a replica's GPUs): 1, 2 or 4 on 8 "
        "GPUs a node."]


@pytest.mark.parametrize("paths", [{"algorithm.adv_estimator": "rloo"}, {R + "name": "vllm"},
                                   {A + "strategy": "fsdp"}, {R + "tensor_model_parallel_size": 8},
                                   {"algorithm.adv_estimator": "gae"}, {"actor_rollout_ref.model.lora_rank": 512}])
def test_settings_the_stack_runs_pass(paths: dict[str, Any]) -> None:
    [(path, value)] = paths.items()
    assert cfg_with(paths).verl.get(path) == value


def test_synth_refuses_a_setting_the_stack_cannot_run_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    value = verl_value({"actor_rollout_ref.model.lora_rank": 1024, R + "name": "sglang"})
    assert synth.main(["a4", "--out", str(tmp_path), "--set", f"{KEY}={value}"]) == 2
    _, err = capsys.readouterr()
    assert "lora_rank = 1024: at most 512" in err and "holds vLLM only" in err
    assert "Traceback" not in err and not (tmp_path.exists() and any(tmp_path.iterdir()))


# --- experiment tracking: trainer.logger (issue 49, item 1) --------------------------------------------------

def synth_job(tmp_path: Path, **config: str) -> dict[str, Any]:
    """The GRPO job's inputs as synth renders them (resources.json): entrypoint, runtime_env, run_id."""
    sets = [arg for key, value in config.items() for arg in ("--set", f"{key}={value}")]
    assert synth.main(["a4", "--out", str(tmp_path), *sets]) == 0
    [job] = [r for r in json.loads((tmp_path / "resources.json").read_text())
             if r["type"] == "pulumi-python:dynamic:GrpoJob"]
    return job["inputs"]


def test_tensorboard_writes_its_event_files_to_the_bucket_under_the_run(tmp_path: Path) -> None:
    # verl's _TensorboardAdapter writes to $TENSORBOARD_DIR, else to tensorboard_log/<project>/<experiment> under the
    # process's working directory: the pod's disk, gone at release.
    job = synth_job(tmp_path, **{KEY: verl_value({"trainer.logger": ["console", "tensorboard"]})})
    env = job["runtime_env"]["env_vars"]
    assert env["TENSORBOARD_DIR"] == f"/data/verl/checkpoints/{job['run_id']}/tensorboard"
    # A managed folder the Ray pods may write, which outlives the cluster (domain/bucket.py).
    assert bucket_path(env["TENSORBOARD_DIR"]).startswith(ray_writable_prefixes("/data/verl/checkpoints"))
    assert "MLFLOW_TRACKING_URI" not in env


def test_the_console_logger_alone_adds_no_tracking_variable(tmp_path: Path) -> None:
    env = synth_job(tmp_path)["runtime_env"]["env_vars"]
    assert not {"TENSORBOARD_DIR", "MLFLOW_TRACKING_URI", "WANDB_API_KEY"} & set(env)


def test_mlflow_logs_to_the_tracking_uri_of_its_key(tmp_path: Path) -> None:
    job = synth_job(tmp_path, **{KEY: verl_value({"trainer.logger": ["console", "mlflow"]}),
                                 "verl-gke:mlflowTrackingUri": "https://mlflow.example.com"})
    assert job["runtime_env"]["env_vars"]["MLFLOW_TRACKING_URI"] == "https://mlflow.example.com"
    assert "trainer.logger=[console,mlflow]" in shlex.split(job["entrypoint"])


def test_mlflow_without_a_tracking_uri_is_refused_naming_the_key() -> None:
    assert refused({"trainer.logger": "mlflow"}) == [
        'verl-gke:mlflowTrackingUri = "": trainer.logger has mlflow, which without a tracking server writes to '
        "sqlite:////tmp/mlruns.db on a pod, lost at release: set the server's http(s):// URL."]


# The Ray pods' egress policy admits the server's port (manifests/network_policy.py): a port it cannot name is refused.
@pytest.mark.parametrize("uri", ["sqlite:////tmp/mlruns.db", "mlflow.example.com", "https://user:pw@mlflow.example",
                                 "http://mlflow.example:abc", "http://mlflow.example:0", "http://mlflow.example:65536",
                                 "http://:5000"])
def test_a_tracking_uri_that_is_not_a_plain_server_url_is_refused(uri: str) -> None:
    [line] = refused({"trainer.logger": ["console", "mlflow"]}, **{"verl-gke:mlflowTrackingUri": uri})
    assert line.startswith("verl-gke:mlflowTrackingUri = ") and line.endswith(
        ": an http:// or https:// URL of an MLflow tracking server: a host, a port from 1 to 65535 if not the "
        "scheme's, no credentials (they would be in the job's command and Pulumi's state).")
    assert "pw" not in line


def test_a_logger_verl_gke_does_not_wire_is_refused_with_those_it_does() -> None:
    assert refused({"trainer.logger": ["console", "swanlab", "file"]}) == [
        'verl-gke:verl.trainer.logger = ["console", "swanlab", "file"]: verl-gke wires console, tensorboard, '
        'mlflow and wandb (not swanlab, file).']


def test_dynamic_sampling_on_an_x86_stack_says_it_runs_on_a4x_only() -> None:
    assert refused({"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc"}) == [
        "verl-gke:verl.algorithm.filter_groups.enable = true: verl 0.6.1's config has no algorithm.filter_groups: "
        "DAPO's dynamic sampling runs on A4X (verl 0.9.0) only (verl-gke:platform a4x).",
        'verl-gke:verl.algorithm.filter_groups.metric = "acc": verl 0.6.1\'s config has no algorithm.filter_groups: '
        "DAPO's dynamic sampling runs on A4X (verl 0.9.0) only (verl-gke:platform a4x)."]


def test_a_reward_function_path_set_in_verl_is_refused_for_reward_function(tmp_path: Path) -> None:
    a4x = {"verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"}
    assert refused({"custom_reward_function.path": "/data/reward/my_reward.py"}) == [
        'verl-gke:verl.custom_reward_function.path = "/data/reward/my_reward.py": use verl-gke:rewardFunction (checked '
        "and uploaded)."]
    assert refused({"reward.custom_reward_function.path": "/data/r.py"}, **a4x) == [
        'verl-gke:verl.reward.custom_reward_function.path = "/data/r.py": use verl-gke:rewardFunction (checked and '
        "uploaded)."]
    reward = tmp_path / "mine.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    ours = reward_fn.verl_paths(str(reward))["custom_reward_function.path"]
    assert cfg_with({"custom_reward_function.path": ours}, **{reward_fn.KEY: str(reward)}).verl.get(
        "custom_reward_function.path") == ours


def test_a_token_budget_below_one_whole_sequence_is_refused_with_the_minimum() -> None:
    """verl's rearrange_micro_batches (verl/utils/seqlen_balancing.py, 0.6.1 and 0.9.0) asserts each dynamic
    batch budget x the Ulysses size holds the longest sequence: up to max_prompt_length + max_response_length."""
    assert refused({"data.max_response_length": 16384}) == [
        "verl-gke:verl.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 16384: with dynamic batch size verl needs "
        "it to hold one whole sequence (data.max_prompt_length + data.max_response_length = 16896 tokens, over "
        "Ulysses size 1): raise it to at least 16896."]
    budget = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    assert refused({budget: 1023})[0].endswith("(data.max_prompt_length + data.max_response_length = 1024 tokens, "
                                               "over Ulysses size 1): raise it to at least 1024.")
    assert cfg_with({budget: 1024}).verl.get(budget) == 1024
    assert cfg_with({budget: 1000, "actor_rollout_ref.actor.use_dynamic_bsz": False}).verl.get(budget) == 1000
    # With LoRA the actor without its adapters is the reference (verl's ref_in_actor): the ref's budget is unread.
    ref_budget = "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"
    assert cfg_with({ref_budget: 500, "actor_rollout_ref.model.lora_rank": 64, "actor_rollout_ref.actor.use_kl_loss":
                     True}).verl.get(ref_budget) == 500
    a4x = {"verl-gke:platform": "a4x", "verl-gke:gpuNodes": "4"}
    assert refused({"algorithm.adv_estimator": "gae", "critic.forward_max_token_len_per_gpu": 1000,
                    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 500,
                    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 2,
                    "actor_rollout_ref.model.use_remove_padding": True}, **a4x) == [
        "verl-gke:verl.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu = 500: with dynamic batch size verl needs "
        "it to hold one whole sequence (data.max_prompt_length + data.max_response_length = 1024 tokens, over "
        "Ulysses size 2): raise it to at least 512.",
        "verl-gke:verl.critic.forward_max_token_len_per_gpu = 1000: with dynamic batch size verl needs it to hold one "
        "whole sequence (data.max_prompt_length + data.max_response_length = 1024 tokens, over Ulysses size 1): "
        "raise it to at least 1024."]
