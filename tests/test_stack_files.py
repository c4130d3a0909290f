"""Stack files as a user writes them: anything Pulumi would not read as config is one clear
problem naming the file (and line and column), never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from domain.config import ConfigError
from domain import stack_files
from verl_gke import synth

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    return tmp_path


@pytest.mark.parametrize(("text", "problem"), [
    ("config:\n  verl-gke:gpuNodes: [1\n", "Pulumi.bad.yaml: not valid YAML at line 3, column 1: "),
    ("config:\n\tverl-gke:gpuNodes: 2\n", "Pulumi.bad.yaml: not valid YAML at line 2, column 1: "),
    ("- a\n- b\n", "Pulumi.bad.yaml: the top level must be a mapping with a `config:` key, not a list"),
    ("just text\n", "Pulumi.bad.yaml: the top level must be a mapping with a `config:` key, not a str"),
    ("config:\n  - verl-gke:gpuNodes\n", "config: must map keys to values, not a list"),
    ("verl-gke:gpuNodes: 4\n", "verl-gke:gpuNodes: not under `config:`, so Pulumi ignores it; indent it under `config:`"),
])
def test_a_broken_stack_file_is_named_with_where_and_why(project: Path, text: str, problem: str) -> None:
    (project / "Pulumi.bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        stack_files.raw_config("bad", project)
    assert str(caught.value).startswith("Pulumi.bad.yaml has 1 problem:\n  ")
    assert caught.value.problems[0].startswith(problem)


def test_pulumis_own_stack_file_keys_are_left_alone(project: Path) -> None:
    (project / "Pulumi.ok.yaml").write_text("secretsprovider: passphrase\nencryptionsalt: v1:abc\n"
                                            "config:\n  gcp:project: my-project-123\n")
    raw, _ = stack_files.raw_config("ok", project)
    assert raw["gcp:project"] == "my-project-123"


def test_synth_of_a_broken_stack_file_exits_2_with_one_line_and_clears_its_old_output(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = REPO / "Pulumi.broken-by-test.yaml"
    out = tmp_path / "out"
    assert synth.main(["a4", "--out", str(out)]) == 0
    bad.write_text("config:\n  verl-gke:gpuNodes: [1\n")
    try:
        capsys.readouterr()
        assert synth.main(["broken-by-test", "--out", str(out)]) == 2
    finally:
        bad.unlink()
    err = capsys.readouterr().err.split("\n", 1)[1]  # after what synth was doing
    assert err.startswith("synth failed: Pulumi.broken-by-test.yaml has 1 problem:\n"
                          "  Pulumi.broken-by-test.yaml: not valid YAML at line 3, column 1: ")
    assert "Traceback" not in err
    assert not (out / "resources.json").exists()


def test_a_stack_file_that_is_not_utf8_is_one_problem(project: Path) -> None:
    (project / "Pulumi.bad.yaml").write_bytes(b"config:\n  gcp:project: caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        stack_files.raw_config("bad", project)
    assert caught.value.problems == ["Pulumi.bad.yaml: not UTF-8 text (byte 0xe9 at offset 26); save it as UTF-8"]


def test_a_project_file_that_is_not_utf8_is_one_problem(project: Path) -> None:
    (project / "Pulumi.yaml").write_bytes(b"name: verl-gke\ndescription: caf\xe9\n")
    (project / "Pulumi.ok.yaml").write_text("config:\n  gcp:project: my-project-123\n")
    with pytest.raises(ConfigError) as caught:
        stack_files.raw_config("ok", project)
    assert caught.value.problems == ["Pulumi.yaml: not UTF-8 text (byte 0xe9 at offset 31); save it as UTF-8"]


@pytest.mark.parametrize(("yaml_value", "engine"), [
    # yaml.v3 (YAML 1.2) as the Pulumi CLI reads a stack file, then config.Value's text (object.go
    # MarshalString): a timestamp stays its text, `yes` stays a string, 4.0 is the number 4.
    ("2027-03-01T00:00:00Z", "2027-03-01T00:00:00Z"),
    ("yes", "yes"),
    ("True", "true"),
    ("4.0", "4"),
    ("1_000", "1000"),
    ("0x10", "16"),
    ('"4"', "4"),
])
def test_stack_file_values_reach_the_program_as_the_pulumi_cli_passes_them(project: Path, yaml_value: str,
                                                                           engine: str) -> None:
    (project / "Pulumi.t.yaml").write_text(f"config:\n  verl-gke:x: {yaml_value}\n")
    raw, _ = stack_files.raw_config("t", project)
    assert raw["verl-gke:x"] == engine


@pytest.mark.parametrize(("line", "problem"), [
    ("verl-gke:capacity: spot", 'verl-gke:capacity = "spot": must be a YAML list in the stack file (Pulumi.yaml '
                                "declares it array<string>; Pulumi refuses a single value)."),
    ("verl-gke:clusterName: [a, b]", 'verl-gke:clusterName = ["a", "b"]: must be one value, not a YAML list or '
                                     "mapping (Pulumi.yaml declares it string)."),
    ("verl-gke:gpuNodes:", "verl-gke:gpuNodes: empty; give it a value or remove the line (Pulumi refuses an empty "
                           "integer)."),
])
def test_a_stack_file_value_of_the_wrong_shape_is_refused_as_pulumi_would(project: Path, line: str,
                                                                         problem: str) -> None:
    (project / "Pulumi.t.yaml").write_text(f"config:\n  {line}\n")
    with pytest.raises(ConfigError) as caught:
        stack_files.raw_config("t", project)
    assert caught.value.problems == [problem]


def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_both_lines(project: Path) -> None:
    # The Pulumi CLI's YAML reader (yaml.v3) refuses a mapping key defined twice; PyYAML keeps the last.
    (project / "Pulumi.twice.yaml").write_text("config:\n  gcp:project: my-project-123\n  verl-gke:gpuNodes: 2\n"
                                               "  verl-gke:gpuNodes: 4\n")
    with pytest.raises(ConfigError) as caught:
        stack_files.raw_config("twice", project)
    assert caught.value.problems == [
        "Pulumi.twice.yaml: verl-gke:gpuNodes is given twice, at lines 3 and 4 (Pulumi refuses a key given twice); "
        "keep one"]
