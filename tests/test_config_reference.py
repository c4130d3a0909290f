"""docs/configuration.md is generated from Pulumi.yaml and says exactly what Pulumi.yaml declares."""

from __future__ import annotations

import re

import yaml

from domain.stack_files import PROJECT_DIR, engine_string
from verl_gke import config_reference

PROJECT_TEXT = (PROJECT_DIR / "Pulumi.yaml").read_text()
DECLARED = yaml.safe_load(PROJECT_TEXT)["config"]
REFERENCE = (PROJECT_DIR / config_reference.REFERENCE).read_text()
_ROW = re.compile(r"^- `([\w-]+:\w+)` \((\w+), default (.*?)\): (.*)$")


def _rows() -> dict[str, list[str]]:
    """The reference's entries: key -> [type, default, meaning]."""
    return {m.group(1): [m.group(2), m.group(3), m.group(4)] for line in REFERENCE.splitlines()
            if (m := _ROW.match(line))}


def test_the_reference_is_what_the_generator_writes_from_pulumi_yaml():
    assert REFERENCE == config_reference.render(), (
        "docs/configuration.md is stale: run `.venv/bin/python -m verl_gke.config_reference > docs/configuration.md`")


def test_every_declared_key_sits_in_one_group_of_pulumi_yaml():
    grouped = [key for _, keys in config_reference.groups(PROJECT_TEXT) for key in keys]
    assert sorted(grouped) == sorted(DECLARED)


def test_the_reference_lists_every_key_with_its_declared_type_default_and_description():
    rows = _rows()
    assert sorted(set(DECLARED) ^ set(rows)) == []
    wrong = []
    for key, decl in DECLARED.items():
        kind, default, meaning = rows[key]
        text = engine_string(decl["default"])
        # Code marks around <placeholders> (GitHub drops bare <tags>), no more.
        if (kind, default, meaning.replace("`", "")) != (decl["type"], f"`{text}`" if text else '`""`',
                                                           decl["description"].replace("`", "")):
            wrong.append(f"{key}: reference {[kind, default, meaning]}")
        if "<" in re.sub(r"`[^`]*`", "", meaning):
            wrong.append(f"{key}: a <placeholder> outside `code` renders as nothing on GitHub")
    assert wrong == []


def test_a_placeholder_word_is_put_in_code_and_code_is_left_alone():
    assert config_reference._code_marked("empty means verl-<stack>-<gcp:project>.") == \
        "empty means `verl-<stack>-<gcp:project>`."
    assert config_reference._code_marked("as `<prefix>-net`, (`x`)") == "as `<prefix>-net`, (`x`)"
    assert config_reference._code_marked("no placeholder") == "no placeholder"
