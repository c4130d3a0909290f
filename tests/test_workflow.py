"""The users' GitHub Actions workflow: valid against GitHub's workflow schema, and built as promised.

Schema: check-jsonschema's vendored copy of SchemaStore's github-workflow.json (offline).
Conditions: the `if:` expressions are evaluated for each event, so "up only on main" is checked
by meaning, not by spelling.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "deploy.yml"
MAIN = "refs/heads/main"


def load() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 (PyYAML) reads the bare key `on` as the boolean True.
    return workflow.get("on", workflow.get(True))


def steps_running(workflow: dict[str, Any], command: str) -> list[tuple[str, dict[str, Any]]]:
    """(job id, step) for every step whose shell script runs `command`."""
    return [(job_id, step) for job_id, job in workflow["jobs"].items() for step in job["steps"]
            if re.search(rf"(^|[\s;|&]){re.escape(command)}(\s|$)", step.get("run", ""))]


def check_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True, text=True, timeout=120,
    )


# --- A small evaluator for the GitHub expressions this workflow uses --------------------------

_TOKEN = re.compile(r"\s*(?:(?P<str>'[^']*')|(?P<op>&&|\|\||==|!=|!|\(|\))|(?P<name>[A-Za-z_][\w.\-]*))")


def evaluate(expression: str, context: dict[str, str]) -> bool:
    """Evaluates `==`, `!=`, `!`, `&&`, `||`, parentheses, string literals and context names.

    GitHub compares strings case-insensitively; every name must be in `context`, so an expression
    that reads something this test does not model fails loudly instead of passing by accident.
    """
    text = expression.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2].strip()
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        assert match and match.end() > position, f"cannot read {expression!r} at {text[position:]!r}"
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
    result, rest = _or(tokens, context)
    assert not rest, f"unread tokens in {expression!r}: {rest}"
    return bool(result)


_Value = str | bool
_Tokens = list[tuple[str, str]]


def _or(tokens: _Tokens, context: dict[str, str]) -> tuple[_Value, _Tokens]:
    left, tokens = _and(tokens, context)
    while tokens[:1] == [("op", "||")]:
        right, tokens = _and(tokens[1:], context)
        left = bool(left) or bool(right)
    return left, tokens


def _and(tokens: _Tokens, context: dict[str, str]) -> tuple[_Value, _Tokens]:
    left, tokens = _compare(tokens, context)
    while tokens[:1] == [("op", "&&")]:
        right, tokens = _compare(tokens[1:], context)
        left = bool(left) and bool(right)
    return left, tokens


def _compare(tokens: _Tokens, context: dict[str, str]) -> tuple[_Value, _Tokens]:
    left, tokens = _unary(tokens, context)
    if tokens[:1] in ([("op", "==")], [("op", "!=")]):
        op = tokens[0][1]
        right, tokens = _unary(tokens[1:], context)
        left = (left == right) if op == "==" else (left != right)
    return left, tokens


def _unary(tokens: _Tokens, context: dict[str, str]) -> tuple[_Value, _Tokens]:
    kind, value = tokens[0]
    if (kind, value) == ("op", "!"):
        operand, rest = _unary(tokens[1:], context)
        return not operand, rest
    if (kind, value) == ("op", "("):
        inner, rest = _or(tokens[1:], context)
        assert rest[:1] == [("op", ")")], "unbalanced parentheses"
        return inner, rest[1:]
    if kind == "str":
        return value[1:-1].lower(), tokens[1:]
    assert kind == "name" and value in context, f"expression reads {value}, which the test does not model"
    return context[value].lower(), tokens[1:]


def event(name: str, ref: str, *, fork: bool = False) -> dict[str, str]:
    repository = "me/verl-gke"
    return {
        "github.event_name": name,
        "github.ref": ref,
        "github.repository": repository,
        "github.event.pull_request.head.repo.full_name": "someone/verl-gke" if fork else repository,
    }


EVENTS = {
    "same-repo PR": event("pull_request", "refs/pull/7/merge"),
    "fork PR": event("pull_request", "refs/pull/8/merge", fork=True),
    "push to main": event("push", MAIN),
    "dispatch on main": event("workflow_dispatch", MAIN),
    "dispatch on a branch": event("workflow_dispatch", "refs/heads/try-a4x"),
}


def runs(job: dict[str, Any], step: dict[str, Any] | None, context: dict[str, str]) -> bool:
    """Whether a job (and a step of it) runs for this event, by their `if:` conditions."""
    return all(evaluate(str(part["if"]), context) for part in (job, step or {}) if "if" in part)


# --- Tests --------------------------------------------------------------------------------------


def test_workflow_passes_githubs_workflow_schema() -> None:
    result = check_schema(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    broken = load()
    broken["permissions"]["id-token"] = "admin"  # not one of read / write / none
    path = tmp_path / "deploy.yml"
    path.write_text(yaml.safe_dump({"on": triggers(broken), **{k: v for k, v in broken.items() if k is not True}}))
    result = check_schema(path)
    assert result.returncode == 1
    assert "id-token" in result.stdout


def test_triggers_are_pull_requests_pushes_to_main_and_manual_runs() -> None:
    on = triggers(load())
    assert set(on) == {"pull_request", "push", "workflow_dispatch"}
    assert on["push"] == {"branches": ["main"]}
    assert on["pull_request"] == {"branches": ["main"]}
    stack = on["workflow_dispatch"]["inputs"]["stack"]
    assert stack["options"] == ["a4", "a4-standard", "a3u-standard", "a4x", "smoke"]


def test_stack_comes_from_the_form_then_the_repository_variable() -> None:
    assert load()["env"]["STACK"] == "${{ inputs.stack || vars.STACK || 'a4-standard' }}"


def test_only_the_jobs_on_main_that_authenticate_get_an_oidc_token() -> None:
    workflow = load()
    assert workflow["permissions"] == {"contents": "read"}
    widened = {job_id: job["permissions"] for job_id, job in workflow["jobs"].items() if "permissions" in job}
    assert widened == {"up": {"contents": "read", "id-token": "write"}, "follow": {"contents": "read", "id-token": "write"}}
    for job_id, job in workflow["jobs"].items():
        authenticates = any(s.get("uses", "").startswith("google-github-actions/auth@") for s in job["steps"])
        assert authenticates == (job_id in widened), job_id


def test_every_action_is_pinned_to_a_full_commit_sha_with_its_release_noted() -> None:
    uses = [line.strip() for line in WORKFLOW.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
    pins = set()
    for line in uses:
        match = re.fullmatch(r"(?:- )?uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40}) # (v\d+\.\d+\.\d+)", line)
        assert match, line
        pins.add(match.groups())
    # Each SHA is the commit its release tag points to in the action's repository.
    assert pins == {
        ("actions/checkout", "3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
        ("actions/setup-python", "5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
        ("google-github-actions/auth", "7c6bc770dae815cd3e89ee6cdf493a5fab2cc093", "v3.0.0"),
        ("google-github-actions/setup-gcloud", "aa5489c8933f4cc7a4f7d45035b3b1440c9c10db", "v3.0.1"),
        ("pulumi/actions", "8e5e406f4007fca908480587cb9893c07090f58d", "v7.0.0"),
        ("actions/upload-artifact", "bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    }
    assert len(uses) == 15  # test 2, synth 2, up 5, follow 6


def test_pulumi_up_runs_only_for_pushes_and_manual_runs_on_main() -> None:
    workflow = load()
    (job_id, up), = steps_running(workflow, "pulumi up")
    job = workflow["jobs"][job_id]
    ran = {name: runs(job, up, context) for name, context in EVENTS.items()}
    assert ran == {"same-repo PR": False, "fork PR": False, "push to main": True,
                   "dispatch on main": True, "dispatch on a branch": False}
    assert "--yes" in up["run"].split()


def test_pulumi_preview_runs_only_beside_up_on_main() -> None:
    workflow = load()
    (job_id, preview), = steps_running(workflow, "pulumi preview")
    assert job_id == "up"
    ran = {name: runs(workflow["jobs"][job_id], preview, context) for name, context in EVENTS.items()}
    assert ran == {"same-repo PR": False, "fork PR": False, "push to main": True,
                   "dispatch on main": True, "dispatch on a branch": False}


def test_pull_requests_synthesize_every_stack_without_any_credential() -> None:
    workflow = load()
    (job_id, step), = steps_running(workflow, "make synth-all")
    job = workflow["jobs"][job_id]
    assert job["needs"] == "test"
    ran = {name: runs(job, step, context) for name, context in EVENTS.items()}
    assert ran == {"same-repo PR": True, "fork PR": True, "push to main": False,
                   "dispatch on main": False, "dispatch on a branch": True}
    for job_id in ("test", "synth"):
        text = yaml.safe_dump(workflow["jobs"][job_id])
        assert "secrets." not in text and "environment" not in workflow["jobs"][job_id], job_id
        assert "permissions" not in workflow["jobs"][job_id] and "id-token" not in text, job_id


def test_tests_run_for_every_event() -> None:
    workflow = load()
    (job_id, step), = steps_running(workflow, "make test")
    assert job_id == "test"
    assert all(runs(workflow["jobs"]["test"], step, context) for context in EVENTS.values())


def test_gcp_auth_is_workload_identity_federation_only() -> None:
    workflow = load()
    auths = [step for job in workflow["jobs"].values() for step in job["steps"]
             if step.get("uses", "").startswith("google-github-actions/auth@")]
    assert len(auths) == 2
    for step in auths:
        assert set(step["with"]) == {"workload_identity_provider", "service_account", "project_id"}
        assert step["with"]["workload_identity_provider"] == "${{ vars.GCP_WORKLOAD_IDENTITY_PROVIDER }}"


def test_pulumi_credentials_and_the_deploy_identity_exist_only_in_the_deploy_environment() -> None:
    workflow = load()
    for job_id, job in workflow["jobs"].items():
        text = yaml.safe_dump(job)
        holds = "secrets.PULUMI" in text or "GCP_SERVICE_ACCOUNT" in text
        assert holds == (job.get("environment") == "deploy"), job_id
    assert {j for j, job in workflow["jobs"].items() if job.get("environment") == "deploy"} == {"up", "follow"}
    assert "env" not in workflow or not any("secrets." in str(v) for v in workflow["env"].values())


def test_no_hugging_face_token_passes_through_the_workflow() -> None:
    text = WORKFLOW.read_text()
    assert "secrets.HF_TOKEN" not in text and "hfToken" not in text
    scripts = [step.get("run", "") for job in load()["jobs"].values() for step in job["steps"]]
    assert [script for script in scripts if "--show-secrets" in script] == []


def test_jobs_with_the_deploy_identity_install_packages_by_hash_only() -> None:
    workflow = load()
    makefile = (WORKFLOW.parent.parent.parent / "Makefile").read_text()
    recipe = makefile.split("\ndeploy-venv:\n", 1)[1].split("\n\n", 1)[0]
    installs = [line.strip() for line in recipe.splitlines() if "pip install " in line]
    assert installs[0].endswith("--no-deps --require-hashes --no-build-isolation -r requirements.lock")
    assert "--no-deps" in installs[1] and installs[1].endswith("-e .") and len(installs) == 2
    for job_id in ("up", "follow"):
        scripts = [step.get("run", "") for step in workflow["jobs"][job_id]["steps"]]
        assert "make deploy-venv" in scripts, job_id
        assert not [s for s in scripts if "pip install" in s or re.search(r"make (synth|test)\b", s)], job_id


def test_the_lock_pins_the_whole_runtime_tree_by_hash() -> None:
    root = WORKFLOW.parent.parent.parent
    lock = re.findall(r"^([a-z0-9-]+)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$",
                      (root / "requirements.lock").read_text(), re.M)
    pinned = {name: version for name, version, _ in lock}
    assert len(pinned) == len(lock) > 50
    constraints = {}
    for line in (root / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].split("==")  # (an environment marker after ';')
            constraints[name.strip().lower().replace("_", "-")] = version.strip()
    for line in (root / "requirements.txt").read_text().splitlines():
        if "==" in line:
            name, version = line.split("==")
            assert pinned[name.split("[")[0].lower().replace("_", "-")] == version.strip(), name
    assert {n: v for n, v in pinned.items() if n in constraints and constraints[n] != v} == {}
    assert pinned["setuptools"] == "80.9.0"  # the build backend pyproject.toml names


def test_after_up_the_run_is_awaited_with_the_cli_its_bucket_logs_read_and_the_plot_uploaded() -> None:
    workflow = load()
    follow = workflow["jobs"]["follow"]
    assert follow["needs"] == "up"
    assert {name: runs(follow, None, context) for name, context in EVENTS.items()} == {
        "same-repo PR": False, "fork PR": False, "push to main": True,
        "dispatch on main": True, "dispatch on a branch": False,
    }
    scripts = [step.get("run", "") for step in follow["steps"]]
    order = [
        next(i for i, s in enumerate(scripts) if 'pulumi stack output --json --stack "$STACK" > run/outputs.json' in s),
        next(i for i, s in enumerate(scripts) if "\n.venv/bin/verl-gke wait --outputs run/outputs.json" in s),
        # The run's logs from the bucket copy, final once flushed before the release: no race with it.
        next(i for i, s in enumerate(scripts)
             if "verl-gke logs --outputs run/outputs.json --all --from-bucket --copy-wait" in s),
        next(i for i, s in enumerate(scripts) if "verl-gke metrics --log-file run/grpo-run.log --plot run/reward.png" in s),
        next(i for i, step in enumerate(follow["steps"]) if step.get("uses", "").startswith("actions/upload-artifact@")),
    ]
    assert order == sorted(order)
    # The run is followed by its id (stack output runId), never by a submission id that changes on a retry.
    assert not any("--submission-id" in s for s in scripts)
    upload = follow["steps"][order[-1]]
    # The plot, the metrics and the outputs; never the job's log (what a job prints stays in the bucket).
    # Never the job's own log (it stays in the bucket): what verl-gke itself wrote.
    assert upload["with"]["path"].split() == ["run/reward.png", "run/metrics.txt", "run/outputs.json",
                                              "run/outcome.json", "run/verify.txt", "run/report.txt",
                                              "run/report.png"]
    # The plot is uploaded even when the job failed or the wait timed out.
    assert upload["if"] == "${{ !cancelled() && steps.outputs.outcome == 'success' }}"


@pytest.mark.parametrize(("expression", "context", "expected"), [
    ("a == 'x' && !(b != 'Y')", {"a": "X", "b": "y"}, True),
    ("a == 'x' || b == 'z'", {"a": "w", "b": "y"}, False),
    ("a == 'x' || a == 'w' && b == 'z'", {"a": "x", "b": "y"}, True),  # && binds tighter
])
def test_the_expression_evaluator_itself(expression: str, context: dict[str, str], expected: bool) -> None:
    assert evaluate(expression, context) is expected


def _setup_text() -> str:
    """The workflow's set-up instructions: its leading comment block, without the `# `."""
    lines = []
    for line in WORKFLOW.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines)


def _shell_command(text: str, start: str) -> list[str]:
    """The words of the (backslash-continued) command in `text` that starts with `start`."""
    import shlex

    at = text.index(start)
    command = []
    for line in text[at:].splitlines():
        command.append(line.strip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split(" ".join(command))


def test_the_deploy_identity_can_be_impersonated_only_from_this_repository_and_its_deploy_environment() -> None:
    """Environment names are not unique across GitHub: the provider's condition pins the repository
    (its id and its owner's id, which a rename or transfer does not reuse) and the environment, and
    the binding names the one subject `repo:<owner>/<repo>:environment:deploy` (GitHub's `sub` for
    a job in an environment; GitHub docs, "About security hardening with OpenID Connect")."""
    text = _setup_text()
    provider = _shell_command(text, "gcloud iam workload-identity-pools providers create-oidc")
    condition = next(w.split("=", 1)[1] for w in provider if w.startswith("--attribute-condition="))
    terms = {t.strip() for t in condition.split("&&")}
    assert terms == {"assertion.repository_id == '<REPOSITORY_ID>'",
                     "assertion.repository_owner_id == '<OWNER_ID>'",
                     "assertion.environment == 'deploy'"}, condition
    assert "||" not in condition
    assert "--issuer-uri=https://token.actions.githubusercontent.com" in provider
    binding = _shell_command(text, "gcloud iam service-accounts add-iam-policy-binding")
    assert "--role=roles/iam.workloadIdentityUser" in binding
    assert ("--member=principal://iam.googleapis.com/projects/<PROJECT_NUMBER>/locations/global/"
            "workloadIdentityPools/<POOL>/subject/repo:<OWNER>/<REPO>:environment:deploy") in binding
    assert "principalSet://" not in text


def test_the_deploy_jobs_install_a_pinned_gcloud() -> None:
    """setup-gcloud installs the newest Google Cloud CLI unless told a version: jobs holding the
    deploy identity would run whatever was released that morning."""
    steps = [step for job in load()["jobs"].values() for step in job["steps"]
             if step.get("uses", "").startswith("google-github-actions/setup-gcloud@")]
    assert len(steps) == 2
    for step in steps:
        version = str(step["with"].get("version", ""))
        if match := re.fullmatch(r"\$\{\{ env\.(\w+) \}\}", version):
            version = str(load()["env"][match.group(1)])
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), step


def test_after_up_the_stack_is_verified_while_the_run_stands_and_reported_once_it_ended() -> None:
    follow = load()["jobs"]["follow"]
    steps = follow["steps"]
    scripts = [step.get("run", "") for step in steps]
    outputs = next(i for i, s in enumerate(scripts) if "> run/outputs.json" in s)
    verify = next(i for i, s in enumerate(scripts) if ".venv/bin/verl-gke verify --outputs run/outputs.json" in s)
    wait = next(i for i, s in enumerate(scripts) if "\n.venv/bin/verl-gke wait " in s)
    report = next(i for i, s in enumerate(scripts)
                  if ".venv/bin/verl-gke report --outputs run/outputs.json --plot run/report.png" in s)
    logs = next(i for i, s in enumerate(scripts) if "verl-gke logs --outputs run/outputs.json --all" in s)
    upload = next(i for i, step in enumerate(steps) if step.get("uses", "").startswith("actions/upload-artifact@"))
    # verify reads the pods and the head: before the release takes them; its FAIL fails the job at the end,
    # after the run was followed and its files uploaded.
    assert outputs < verify < wait < logs < report < upload
    assert steps[verify]["id"] == "verify" and steps[verify]["continue-on-error"] is True
    assert "run/verify.txt" in scripts[verify] and "pipefail" in scripts[verify]
    last = steps[-1]
    assert last["if"] == "${{ !cancelled() && steps.verify.outcome == 'failure' }}"
    assert "exit 1" in last["run"]


def test_ci_reads_the_runs_final_outcome_and_model_uri_from_wait_json_not_the_stale_outputs() -> None:
    """`pulumi stack output` after `up` holds grpoJobStatus/modelUri as that `up` saw them (RUNNING, '');
    `verl-gke wait --json` answers from the run record once the run (and a claimed export) ended."""
    follow = load()["jobs"]["follow"]
    waits = [s for s in follow["steps"] if "verl-gke wait " in s.get("run", "")]
    assert len(waits) == 1
    wait = waits[0]
    assert wait["id"] == "run"
    assert "--json" in wait["run"] and "> run/outcome.json" in wait["run"]
    assert 'echo "model_uri=$(jq -r .modelUri run/outcome.json)" >> "$GITHUB_OUTPUT"' in wait["run"]
    assert follow["outputs"] == {"model_uri": "${{ steps.run.outputs.model_uri }}",
                                 "outcome": "${{ steps.run.outputs.outcome }}"}
    assert not any("modelUri" in s.get("run", "") and "stack output" in s.get("run", "") for s in follow["steps"])


def test_the_deploy_identitys_iam_admin_grant_is_conditioned_to_the_roles_the_stack_grants(synth_stack) -> None:
    """Why 5: an unconditional projectIamAdmin lets code that reaches a main push make itself owner.
    The condition lists exactly the roles every stack grants at the project (from the real program
    under the mock engine), so a `pulumi up` still works and nothing else can be granted."""
    granted = {r.inputs["role"] for stack in ("a4", "a4-standard", "a3u-standard", "a4x")
               for r in synth_stack(stack).registrations if r.type == "gcp:projects/iAMMember:IAMMember"}
    binding = _shell_command(_setup_text(), "gcloud projects add-iam-policy-binding")
    assert "--role=roles/resourcemanager.projectIamAdmin" in binding
    (condition,) = [w for w in binding if w.startswith("--condition=")]
    match = re.fullmatch(r"--condition=\^:\^title=[\w-]+:expression=api\.getAttribute\("
                         r"'iam\.googleapis\.com/modifiedGrantsByRole', \[\]\)\.hasOnly\(\[(.*)\]\)", condition)
    assert match, condition
    assert {role.strip().strip("'") for role in match.group(1).split(",")} == granted == {
        "roles/container.defaultNodeServiceAccount"}


def test_the_deploy_environment_needs_a_reviewer_other_than_the_pusher_and_main() -> None:
    text = _setup_text()
    put = _shell_command(text, "gh api -X PUT repos/<OWNER>/<REPO>/environments/deploy")
    body = yaml.safe_load(put[put.index("<<<") + 1].replace("<REVIEWER_USER_ID>", "1"))
    assert body == {"reviewers": [{"type": "User", "id": 1}], "prevent_self_review": True,
                    "deployment_branch_policy": {"protected_branches": False, "custom_branch_policies": True}}
    policy = _shell_command(text, "gh api -X POST repos/<OWNER>/<REPO>/environments/deploy/deployment-branch-policies")
    assert policy[-4:] == ["-f", "name=main", "-f", "type=branch"]


def test_an_image_without_a_reviewed_digest_stops_the_deploy_before_preview() -> None:
    up = load()["jobs"]["up"]
    scripts = [step.get("run", "") for step in up["steps"]]
    check = scripts.index('.venv/bin/python -m verl_gke.image_pins --stack "$STACK" --check')
    assert check < next(i for i, s in enumerate(scripts) if s.startswith("pulumi preview"))


@pytest.mark.parametrize(("minutes", "runs"), [("330", True), ("1", True), ("360", True), ("361", False),
                                               ("0", False), ("1+1", False), ("a[$(touch pwned)]", False),
                                               ("x\n::error::forged", False), ("", False)])
def test_wait_minutes_reaches_bash_arithmetic_only_as_whole_minutes(tmp_path: Path, minutes: str, runs: bool) -> None:
    """Why 6: bash arithmetic evaluates a variable's text as an expression (`a[$(cmd)]` runs cmd)."""
    (step,) = [s for s in load()["jobs"]["follow"]["steps"] if s.get("name") == "Wait for the GRPO run"]
    cli = tmp_path / ".venv" / "bin" / "verl-gke"
    cli.parent.mkdir(parents=True)
    cli.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > called\n')
    cli.chmod(0o755)
    (tmp_path / "run").mkdir()  # the outputs step made it
    done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env={
        "WAIT_MINUTES": minutes, "PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(tmp_path / "github-output")},
        capture_output=True, text=True, timeout=30)
    assert not (tmp_path / "pwned").exists()
    if runs:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "called").read_text().split()[-1] == str(int(minutes) * 60)
    else:
        assert done.returncode == 2 and not (tmp_path / "called").exists()
        assert done.stdout.startswith("::error::wait_minutes = ") and done.stdout.count("\n") == 1
