"""Pulumi.yaml declares exactly the keys the program reads, with the model's defaults, and the Pulumi CLI
accepts every stack file (docs/configuration.md's agreement with it: tests/test_config_reference.py)."""

from __future__ import annotations

import pytest
import yaml

from domain.config import NAMESPACE, ConfigError, StackConfig, config_key, load_config
from domain.pulumi_config import TypeProblem, declarations, from_engine, shape_problem
from tests.conftest import BASE_CONFIG
from domain.stack_files import PROJECT_DIR, engine_string, project_defaults, read_stack_file, stack_file, stack_names

DECLARED = yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())


def test_project_is_verl_gke_on_python_with_the_venv():
    assert DECLARED["name"] == "verl-gke"
    assert DECLARED["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}}


def test_every_key_is_declared_with_type_and_description():
    fields = [f for f in StackConfig.model_fields if f not in ("project", "region", "zone")]
    assert set(DECLARED["config"]) == {config_key(f) for f in fields}
    for key, decl in DECLARED["config"].items():
        assert decl.get("type") in _CLI_TYPES, key
        assert decl.get("description"), key


# The project schema's config types (pulumi/pulumi sdk/go/common/workspace/project.json `simpleConfigType`,
# `object` since 3.186/3.187, pulumi/pulumi #20129 and #20132) and what ValidateConfigValue (project.go)
# accepts for each: `object` takes any map, its content unchecked.
_CLI_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


def cli_stack_config_errors(project: dict, stack: str, stack_config: dict) -> list[str]:
    """What the Pulumi CLI refuses before the program runs (pulumi/pulumi sdk/go/common/workspace,
    `ValidateStackConfigAndApplyProjectConfig` / `mergeConfig`, and its tests
    TestStackConfigErrorsWhenMissingStackValueForConfigTypeWithNoDefault and the secret ones): a key of
    the project's namespace declared with a type and no default must be set by every stack; a
    `secret: true` key may have no plaintext default, nor a plaintext stack value; a stack value must
    have the declared type."""
    errors = []
    for key, decl in project.get("config", {}).items():
        full = key if ":" in key else f"{project['name']}:{key}"
        value = stack_config.get(full)
        if decl.get("secret") and "default" in decl:
            errors.append(f"Configuration key '{full}' is not secret but has a default value that must be "
                          "encrypted as it's secret")  # any plaintext default
        if value is None:
            if "type" in decl and "default" not in decl:
                errors.append(f"Stack '{stack}' is missing configuration value '{full}'")
            continue
        secure = isinstance(value, dict) and set(value) == {"secure"}
        if decl.get("secret") and not secure:
            errors.append(f"Stack '{stack}' with configuration key '{full}' must be encrypted as it's secret")
        if not secure and "type" in decl:
            declared = declarations({full: decl})[full]
            try:
                if shape_problem(value, declared):
                    raise TypeProblem(declared.name)
                from_engine(engine_string(value), declared)
            except TypeProblem:
                errors.append(f"Stack '{stack}' with configuration key '{full}' must be of type '{declared.name}'")
    return errors


def test_the_cli_rules_refuse_what_they_refuse():
    project = {"name": "p", "config": {"p:a": {"type": "string"}, "p:b": {"type": "string", "secret": True},
                                       "p:c": {"type": "string", "secret": True, "default": ""},
                                       "p:d": {"type": "integer", "default": 1}}}
    assert cli_stack_config_errors(project, "s", {"p:b": {"secure": "v1:abc"}, "p:d": "x"}) == [
        "Stack 's' is missing configuration value 'p:a'",
        "Configuration key 'p:c' is not secret but has a default value that must be encrypted as it's secret",
        "Stack 's' with configuration key 'p:d' must be of type 'integer'",
    ]
    assert cli_stack_config_errors(project, "s", {"p:a": "x", "p:b": "plain"})[0] == (
        "Stack 's' with configuration key 'p:b' must be encrypted as it's secret")


@pytest.mark.parametrize("stack", stack_names())
def test_the_pulumi_cli_accepts_every_stack_file_as_it_is(stack: str):
    """A token-less preview (a pull request's, a new user's) gets past the CLI's config checks."""
    assert cli_stack_config_errors(DECLARED, stack, read_stack_file(stack_file(stack))) == []


def test_the_cli_takes_a_map_of_verl_paths_under_verl_gke_verl_and_nothing_else():
    assert DECLARED["config"]["verl-gke:verl"]["type"] == "object"
    nested = {"verl-gke:verl": {"data": {"train_batch_size": 128}, "trainer": {"logger": ["console"]}}}
    assert cli_stack_config_errors(DECLARED, "s", nested) == []
    assert cli_stack_config_errors(DECLARED, "s", {"verl-gke:verl": "data.train_batch_size=128"}) == [
        "Stack 's' with configuration key 'verl-gke:verl' must be of type 'object'"]


def test_no_key_is_secret_so_no_secret_ever_needs_a_stack_value():
    assert [k for k, d in DECLARED["config"].items() if d.get("secret")] == []
    assert [k for k, d in DECLARED["config"].items() if "default" not in d] == []


def test_a_stack_that_still_sets_the_token_is_refused_without_printing_it():
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE_CONFIG, f"{NAMESPACE}:hfToken": "hf_CanaryTokenNeverPrinted42"})
    assert caught.value.problems == [
        f"{NAMESPACE}:hfToken: no longer read, and a token in Pulumi config ends up in its state: "
        f"`pulumi config rm {NAMESPACE}:hfToken`, then store the token in Secret Manager with "
        "`gcloud secrets versions add verl-gke-<stack>-hf-token --project <project> --data-file=-`."]


def test_declared_defaults_equal_the_models_defaults():
    defaults_only = {k: engine_string(v) for k, v in project_defaults().items()}
    assert load_config({**defaults_only, **BASE_CONFIG}) == load_config(BASE_CONFIG)


def test_the_four_stacks_exist():
    assert stack_names() == ["a3u-standard", "a4", "a4-standard", "a4x", "smoke"]
