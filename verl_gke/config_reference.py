"""The configuration reference, generated from Pulumi.yaml: `python -m verl_gke.config_reference > docs/configuration.md`.

Pulumi.yaml declares every key with its type, default and description; this renders them as one list per
group (the `# ...` comment lines above each group in Pulumi.yaml), so the reference cannot drift from the
declarations (tests/test_config_reference.py fails when docs/configuration.md differs from this output).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from domain.stack_files import PROJECT_DIR, engine_string

REFERENCE = Path("docs/configuration.md")
"""Where the generated reference lives, relative to the project."""
_GROUP = re.compile(r"^  # (.+)$")
_KEY = re.compile(r"^  ([\w-]+:\w+):\s*$")
_PLACEHOLDER = re.compile(r"[^\s`(]*<[^>\s]+>[^\s`,;.)]*")
"""A word with a <placeholder> in it, which GitHub's renderer would drop as an unknown HTML tag."""

_PREAMBLE = """\
# Configuration reference

Look up a config key here: its type, its default and what it does. Generated from `Pulumi.yaml` by
`python -m verl_gke.config_reference > docs/configuration.md`; do not edit by hand (a test compares them).

Set a key with `pulumi config set <key> <value>`, verl's own settings with `pulumi config set --path
verl-gke:verl.<verl path> <value>` (docs/verl-settings.md). `gcp:project`, `gcp:region` and `gcp:zone`
(the GPU nodes' zone, inside the region) are required. A `0`, `""` or `auto` default means "derived".
How a refusal reads: docs/development.md.
"""

def groups(text: str) -> list[tuple[str, list[str]]]:
    """Pulumi.yaml's keys in file order under the comment heading each group."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if match := _GROUP.match(line):
            out.append((match.group(1), []))
        elif (match := _KEY.match(line)) and out:
            out[-1][1].append(match.group(1))
    return out


def default_cell(declaration: dict) -> str:
    """A declared default as the table shows it: the engine's string, `""` for an empty one."""
    if "default" not in declaration:
        return "none"
    text = engine_string(declaration["default"])
    return f"`{text}`" if text else '`""`'


def _code_marked(text: str) -> str:
    """`text` with each <placeholder> word outside `code` put in code, so GitHub shows it."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = _PLACEHOLDER.sub(lambda m: f"`{m.group(0)}`", parts[i])
    return "`".join(parts)


def render(project_dir: Path = PROJECT_DIR) -> str:
    """docs/configuration.md's text."""
    text = (project_dir / "Pulumi.yaml").read_text()
    declared = yaml.safe_load(text)["config"]
    lines = [_PREAMBLE]
    for title, keys in groups(text):
        lines += [f"## {title}", ""]
        for key in keys:
            decl = declared[key]
            lines.append(f"- `{key}` ({decl['type']}, default {default_cell(decl)}): {_code_marked(decl['description'])}")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
