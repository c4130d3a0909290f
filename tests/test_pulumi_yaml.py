"""Pulumi.yaml declares exactly the keys the program reads, with the model's defaults."""

from __future__ import annotations

import yaml

from components.config import NAMESPACE, StackConfig, config_key, load_config
from components.grpo_spec import GrpoSpec
from tests.conftest import BASE_CONFIG
from verl_gke.stack_config import PROJECT_DIR, engine_string, project_defaults, stack_names

DECLARED = yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())


def test_project_is_verl_gke_on_python_with_the_venv():
    assert DECLARED["name"] == "verl-gke"
    assert DECLARED["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}}


def test_every_key_is_declared_with_type_and_description():
    fields = [f for f in StackConfig.model_fields if f not in ("project", "region", "zone", "grpo")]
    expected = {config_key(f) for f in fields} | {config_key(f"grpo.{f}") for f in GrpoSpec.model_fields}
    expected.add(f"{NAMESPACE}:hfToken")
    assert set(DECLARED["config"]) == expected
    for key, decl in DECLARED["config"].items():
        assert decl.get("type") in ("string", "integer", "boolean", "array"), key
        assert decl.get("description"), key


def test_only_the_token_is_secret_and_has_no_default():
    secret = [k for k, d in DECLARED["config"].items() if d.get("secret")]
    assert secret == [f"{NAMESPACE}:hfToken"]
    assert "default" not in DECLARED["config"][f"{NAMESPACE}:hfToken"]


def test_declared_defaults_equal_the_models_defaults():
    defaults_only = {k: engine_string(v) for k, v in project_defaults().items()}
    assert load_config({**defaults_only, **BASE_CONFIG}) == load_config(BASE_CONFIG)


def test_the_four_stacks_exist():
    assert stack_names() == ["a3u-standard", "a4", "a4-standard", "a4x"]
