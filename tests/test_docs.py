"""The README and docs/ say what the product does: every command in their shell blocks parses with the
CLI's own parser (verl-gke, synth), names keys Pulumi.yaml declares (`pulumi config set`) and make targets
the Makefile has; one synth invocation of the docs actually runs; every link resolves; the worker sizes,
stack outputs and stacks they list are the program's."""

from __future__ import annotations

import ast
import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from domain.config import HF_TOKEN_KEY, ConfigError, load_config
from domain.grpo_spec import RENAMED
from domain.platforms import PLATFORMS
from domain.stack_files import PROJECT_DIR, stack_names
from tests.conftest import BASE_CONFIG
from verl_gke import cli, synth

DOCS = [PROJECT_DIR / "README.md", *sorted((PROJECT_DIR / "docs").glob("*.md"))]
PAGES = [*DOCS, PROJECT_DIR / "CHANGELOG.md"]
DECLARED = yaml.safe_load((PROJECT_DIR / "Pulumi.yaml").read_text())["config"]
PROVIDER_KEYS = {"gcp:project", "gcp:region", "gcp:zone"}
REFUSED_KEYS = {HF_TOKEN_KEY, *(f"verl-gke:{key}" for key in RENAMED)}
"""Keys the docs may name only to say they are refused (the config's own list of their new forms)."""
MISSPELT_EXAMPLES = {"verl-gke:gpuNode"}
"""Keys the docs name as a user's typo, to show the message it gets."""

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_SHELL_FENCES = {"", "sh", "bash", "shell", "console"}
_CONTROL = {"|", "||", "&&", ";"}
_MAKE_TARGET = re.compile(r"^([a-zA-Z][\w-]*):", re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_DOC_PATH = re.compile(r"(?<![\w/.])((?:docs/[\w-]+|README|CHANGELOG)\.md)(?:, \"([^\"]+)\")?")
_NAMED_KEY = re.compile(r"(?<![\w.-])((?:verl-gke|gcp):[A-Za-z][A-Za-z0-9]*)(?![\w:*])")
"""A config key in prose: not a URN's type (`verl-gke:index:...`) nor a family (`verl-gke:grpo*`)."""
_NAMED_SUBCOMMAND = re.compile(r"`(?:\.venv/bin/)?verl-gke ([a-z]+)(?=[\s`])")
_NAMED_TARGET = re.compile(r"`make ([a-z][\w-]*)")


@dataclass(frozen=True)
class Command:
    page: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}: {shlex.join(self.argv)}"


def _lines(block: str) -> list[str]:
    """A shell block's command lines: continuations joined, heredoc bodies dropped, and where the block
    shows prompts (`$ `), only the prompted lines (the rest is output)."""
    raw = block.splitlines()
    prompted = any(line.startswith("$ ") for line in raw)
    out: list[str] = []
    pending, heredoc = "", None
    for line in raw:
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if not pending and prompted:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        if match := re.search(r"<<-?'?(\w+)'?", line):
            heredoc = match.group(1)
        out.append(line)
    return out


def commands(page: Path) -> list[Command]:
    """Every simple command of the page's shell blocks (split at pipes, `&&` and `;`), env assignments dropped."""
    found = []
    for fence, block in _FENCE.findall(page.read_text()):
        if fence not in _SHELL_FENCES:
            continue
        for line in _lines(block):
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
            lexer.whitespace_split, lexer.commenters = True, "#"
            try:
                tokens = list(lexer)
            except ValueError:
                continue  # not shell (an output line with a stray quote)
            argv: list[str] = []
            for token in [*tokens, ";"]:
                if token in _CONTROL:
                    while argv and re.match(r"^[A-Z_]+=", argv[0]):
                        argv.pop(0)
                    if argv:
                        found.append(Command(page.name, tuple(argv)))
                    argv = []
                else:
                    argv.append(token)
    return found


ALL = [command for page in DOCS for command in commands(page)]


def _cli_args(argv: tuple[str, ...]) -> list[str] | None:
    """The verl-gke arguments of a command that runs the CLI, else None."""
    if argv[0] in ("verl-gke", ".venv/bin/verl-gke"):
        return list(argv[1:])
    if len(argv) > 2 and argv[1:3] == ("-m", "verl_gke") and argv[0].endswith("python"):
        return list(argv[3:])
    return None


def _synth_args(argv: tuple[str, ...]) -> list[str] | None:
    if len(argv) > 2 and argv[1:3] == ("-m", "verl_gke.synth") and argv[0].endswith("python"):
        return list(argv[3:])
    return None


def _sample(token: str) -> str:
    """A placeholder (`N`, `RUN_ID`, `<bucket>`) as a value its flag takes."""
    return "1" if re.fullmatch(r"[A-Z][A-Z_]*", token) else token


def test_the_docs_show_commands_of_each_kind():
    kinds = {"cli": _cli_args, "synth": _synth_args}
    for kind, pick in kinds.items():
        assert any(pick(c.argv) is not None for c in ALL), kind
    assert any(c.argv[:3] == ("pulumi", "config", "set") for c in ALL)
    assert any(c.argv[0] == "make" for c in ALL)


def test_every_verl_gke_command_parses_with_the_clis_parser():
    wrong = []
    for command in ALL:
        args = _cli_args(command.argv)
        if args is None:
            continue
        try:
            cli.build_parser().parse_args([_sample(a) for a in args])
        except cli.UsageError as error:
            wrong.append(f"{command}: {error}")
        except SystemExit as done:  # --help, --version
            if done.code:
                wrong.append(f"{command}: exit {done.code}")
    assert wrong == []


def test_every_synth_command_parses_and_sets_declared_keys_with_values_the_config_takes():
    wrong = []
    for command in ALL:
        args = _synth_args(command.argv)
        if args is None:
            continue
        try:
            parsed = synth.build_parser().parse_args(args)
        except synth._UsageError as error:
            wrong.append(f"{command}: {error}")
            continue
        if parsed.stack not in stack_names():
            wrong.append(f"{command}: no stack {parsed.stack}")
        for item in parsed.set:
            key = item.split("=", 1)[0]
            if key not in DECLARED and key not in PROVIDER_KEYS:
                wrong.append(f"{command}: {key} is not declared in Pulumi.yaml")
    assert wrong == []


def test_a_synth_command_of_the_docs_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The docs' own invocation with the most flags, really synthesized (one stack: synth takes seconds)."""
    runs = [args for c in ALL if (args := _synth_args(c.argv)) and "--cloud" not in args]
    args = max((a for a in runs if a[0] == "a4-standard"), key=len)
    assert synth.main([*args, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "resources.json").exists()
    assert capsys.readouterr().out.startswith("verl-gke synth: stack a4-standard: ")


def _config_set(argv: tuple[str, ...]) -> tuple[str, str, bool] | None:
    """(key, value, --path) of `pulumi config set`, else None."""
    if argv[:3] != ("pulumi", "config", "set"):
        return None
    rest = [a for a in argv[3:] if a != "--path"]
    return rest[0], rest[1] if len(rest) > 1 else "", "--path" in argv


def test_every_pulumi_config_set_names_a_declared_key_with_a_value_the_config_takes():
    wrong = []
    for command in ALL:
        if (found := _config_set(command.argv)) is None:
            continue
        key, value, path = found
        root = key.split(".", 1)[0] if path else key
        if root in PROVIDER_KEYS:
            continue
        if root not in DECLARED:
            wrong.append(f"{command}: {root} is not declared in Pulumi.yaml")
        elif path and DECLARED[root]["type"] != "object":
            wrong.append(f"{command}: --path under {root}, which is a {DECLARED[root]['type']}")
        elif not path and "<" not in value:
            try:
                load_config({**BASE_CONFIG, key: value})
            except ConfigError as error:
                wrong.append(f"{command}: {error.problems}")
    assert wrong == []


def test_pulumi_and_make_commands_name_what_exists():
    targets = set(_MAKE_TARGET.findall((PROJECT_DIR / "Makefile").read_text()))
    pulumi = {"login", "stack", "config", "preview", "up", "refresh", "destroy", "state"}
    wrong = []
    for command in ALL:
        argv = command.argv
        if argv[0] == "make":
            wrong += [f"{command}: no target {t}" for t in argv[1:] if "=" not in t and t not in targets]
        if argv[0] == "pulumi" and argv[1] not in pulumi:
            wrong.append(f"{command}: not a pulumi command the docs should need")
    assert wrong == []


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}


def test_every_link_and_named_doc_resolves():
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for target in _LINK.findall(text):
            if target.startswith(("http://", "https://")):
                continue
            name, _, anchor = target.partition("#")
            path = (page.parent / name) if name else page
            if not path.exists():
                wrong.append(f"{page.name}: link to {target}: no such file")
            elif anchor and anchor not in {_slug(h) for h in _headings(path)}:
                wrong.append(f"{page.name}: link to {target}: no such heading")
        for name, section in _DOC_PATH.findall(text):
            if not (PROJECT_DIR / name).exists():
                wrong.append(f"{page.name}: names {name}: no such file")
            elif section and section not in _headings(PROJECT_DIR / name):
                wrong.append(f'{page.name}: names {name}, "{section}": no such section')
    assert wrong == []


def test_every_config_key_the_docs_name_is_declared_or_refused_by_name():
    wrong = []
    for page in DOCS:
        for key in set(_NAMED_KEY.findall(page.read_text())):
            if key.startswith("gcp:") or key in DECLARED or key in REFUSED_KEYS | MISSPELT_EXAMPLES:
                continue
            wrong.append(f"{page.name}: {key}")
    assert sorted(wrong) == []


def test_every_subcommand_and_make_target_the_docs_name_exists():
    subcommands = set(cli.build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001 argparse's tree
    targets = set(_MAKE_TARGET.findall((PROJECT_DIR / "Makefile").read_text()))
    wrong = []
    for page in DOCS:
        text = page.read_text()
        wrong += [f"{page.name}: verl-gke {s}" for s in set(_NAMED_SUBCOMMAND.findall(text))
                  if s not in subcommands]
        wrong += [f"{page.name}: make {t}" for t in set(_NAMED_TARGET.findall(text)) if t not in targets]
    assert wrong == []


def test_the_docs_state_the_derived_worker_sizes():
    text = (PROJECT_DIR / "docs" / "architecture.md").read_text()
    for platform in PLATFORMS.values():
        assert f"{platform.worker_cpus} vCPU / {platform.worker_memory_gi}Gi" in text, platform.name
        if platform.head_on_gpu_node:
            assert f"{platform.head_cpus} vCPU / {platform.head_memory_gi}Gi head" in text, platform.name


def test_the_docs_list_exactly_the_stack_outputs(synth_stack):
    text = (PROJECT_DIR / "docs" / "architecture.md").read_text()
    section = text.split("## Stack outputs", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        if match := re.match(r"^\| (`\w+`(?:, `\w+`)*) \| ", line):
            documented.update(name.strip("` ") for name in match.group(1).split(","))
    assert documented == set(synth_stack("a4-standard").outputs)


def test_the_readme_names_every_stack_in_its_table_and_fits_250_lines():
    readme = (PROJECT_DIR / "README.md").read_text()
    for stack in stack_names():
        assert f"| `{stack}` |" in readme, stack
    assert len(readme.splitlines()) <= 250


def test_commands_are_read_as_a_shell_reads_them(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("""```
$ A=1 verl-gke wait --poll 5 \\
    --timeout 60   # a comment
output line verl-gke nothing
$ printf '%s' "$X" | pulumi config set verl-gke:gpuNodes 4 && make lint
```

```yaml
verl-gke wait --poll soon
```

```
python3 - <<'PY'
verl-gke wait --poll soon
PY
```
""")
    assert [c.argv for c in commands(page)] == [
        ("verl-gke", "wait", "--poll", "5", "--timeout", "60"), ("printf", "%s", "$X"),
        ("pulumi", "config", "set", "verl-gke:gpuNodes", "4"), ("make", "lint"), ("python3", "-", "<<PY")]


def test_a_command_the_parser_refuses_is_reported():
    with pytest.raises(cli.UsageError, match="'soon' is not a number of seconds"):
        cli.build_parser().parse_args(["wait", "--poll", "soon"])
    assert _config_set(("pulumi", "config", "set", "--path", "verl-gke:verl.trainer.total_epochs", "3")) == (
        "verl-gke:verl.trainer.total_epochs", "3", True)
    assert _slug("After `pulumi up`: the gates before the run, and the CLI") == \
        "after-pulumi-up-the-gates-before-the-run-and-the-cli"


def test_the_readmes_figures_for_a4_standard_are_synths(synth_stack):
    """The stacks table quotes synth's model; a4-standard's row is checked (each stack costs a synth)."""
    result = synth_stack("a4-standard")
    lines = result.log + result.modeled
    first = next(line for line in lines if line.startswith("Time to first training step (modeled): "))
    run = next(line for line in lines if line.startswith("Modeled run: "))
    minutes = re.search(r": ([\d.]+) min;", first).group(1)
    duration, gpu_hours = re.search(r" (~\d+ min), ([\d.]+) GPU-hours", run).groups()
    readme = (PROJECT_DIR / "README.md").read_text().splitlines()
    row = next(line for line in readme if line.startswith("| `a4-standard` |") and "GPU-hours" in line)
    assert f"| {minutes} min | {duration}, {gpu_hours} GPU-hours | unknown price |" in row


DOCS_WORD_LIMIT = 20_000
DOCSTRING_LINE_LIMIT = 10
CODE_DIRS = ("domain", "manifests", "workloads", "access", "components", "verl_gke", "bench", "tests")
def _words(path: Path) -> int:
    """Words as `wc -w` counts them: runs of bytes other than ASCII white space."""
    return len(path.read_bytes().split())


def test_the_docs_fit_their_word_budget():
    pages = sorted((PROJECT_DIR / "docs").glob("*.md"))
    counts = {page.name: _words(page) for page in pages}
    assert sum(counts.values()) <= DOCS_WORD_LIMIT, counts


def test_every_docs_page_opens_with_what_a_user_does_with_it():
    """Under its title, a short paragraph (one or two lines) before any section, table or block."""
    wrong = []
    for page in sorted((PROJECT_DIR / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        rest = list(itertools.dropwhile(lambda line: not line.strip(), lines[1:]))
        opening = list(itertools.takewhile(lambda line: line.strip(), rest))
        prose = not any(line.startswith(("#", "|", "```", "- ")) for line in opening)
        if not lines[0].startswith("# ") or not prose or not 1 <= len(opening) <= 2:
            wrong.append(f"{page.name}: {len(opening)} opening lines")
    assert wrong == []


def _docstring_lines(path: Path) -> int:
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[0].end_lineno - body[0].lineno + 1
    return 0


def test_every_module_docstring_is_at_most_ten_lines():
    """The design is told once, in docs/architecture.md; a module's docstring says what the module is."""
    modules = [PROJECT_DIR / "__main__.py", *(p for d in CODE_DIRS for p in sorted((PROJECT_DIR / d).rglob("*.py")))]
    long = {str(p.relative_to(PROJECT_DIR)): n for p in modules
            if (n := _docstring_lines(p)) > DOCSTRING_LINE_LIMIT}
    assert long == {}

