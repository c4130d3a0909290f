"""Staging reads the Hugging Face token from Secret Manager through Workload Identity.

GCP cannot run here: a loopback stand-in answers as the two real APIs do (listed below)."""

# - GKE metadata server: `GET /computeMetadata/v1/instance/service-accounts/default/token` needs the
#   request header `Metadata-Flavor: Google` (refused with 403 otherwise), answers
#   `{"access_token", "expires_in", "token_type": "Bearer"}` with the response header
#   `Metadata-Flavor: Google` (cloud.google.com/compute/docs/metadata/querying-metadata,
#   cloud.google.com/kubernetes-engine/docs/concepts/workload-identity#metadata_server).
# - Secret Manager: `GET /v1/projects/P/secrets/S/versions/latest:access` with `Authorization: Bearer`
#   answers `{"name", "payload": {"data": base64, "dataCrc32c": int64 as a string}}`; a secret without
#   a version is 404 NOT_FOUND, a caller without `secretmanager.versions.access` 403 PERMISSION_DENIED,
#   in Google's error shape `{"error": {"code", "message", "status"}}`
#   (cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets.versions/access,
#   cloud.google.com/apis/design/errors).

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workloads import stage_data as sd

SECRET = "projects/my-project-123/secrets/verl-gke-a4-hf-token"
TOKEN = "hf_CanaryTokenNeverPrinted42"
ACCESS = "ya29.federated-access-token"


class StandIn:
    """The metadata server and Secret Manager on one loopback port."""

    def __init__(self) -> None:
        self.versions: list[str] = []
        self.denials = 0
        """Answer 403 this many times first (an IAM binding not yet applied)."""
        self.flavor = "Google"
        self.corrupt = False
        self.requests: list[str] = []

    def handle(self, h: BaseHTTPRequestHandler) -> tuple[int, dict, dict]:
        self.requests.append(h.path)
        if h.path == "/computeMetadata/v1/instance/service-accounts/default/token":
            if h.headers.get("Metadata-Flavor") != "Google":
                return 403, {}, {}
            return 200, {"access_token": ACCESS, "expires_in": 3599, "token_type": "Bearer"}, {
                "Metadata-Flavor": self.flavor}
        if h.path == f"/v1/{SECRET}/versions/latest:access":
            if h.headers.get("Authorization") != f"Bearer {ACCESS}":
                return 401, _error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."), {}
            if self.denials:
                self.denials -= 1
                return 403, _error(403, "PERMISSION_DENIED",
                                   f"Permission 'secretmanager.versions.access' denied for resource '{SECRET}/versions/latest'"), {}
            if not self.versions:
                return 404, _error(404, "NOT_FOUND", f"Secret Version [{SECRET}/versions/latest] not found."), {}
            data = self.versions[-1].encode()
            crc = sd.crc32c(data) + (1 if self.corrupt else 0)
            return 200, {"name": f"{SECRET}/versions/{len(self.versions)}",
                         "payload": {"data": base64.b64encode(data).decode(), "dataCrc32c": str(crc)}}, {}
        return 404, _error(404, "NOT_FOUND", "no such path"), {}


def _error(code: int, status: str, message: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}


@pytest.fixture
def standin() -> Iterator[tuple[StandIn, str]]:
    state = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, body, headers = state.handle(self)
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _read(root: str, **kw: object) -> str | None:
    return sd.read_hf_token(SECRET, metadata_root=f"{root}/computeMetadata/v1", api_root=f"{root}/v1",
                            sleep=lambda _s: None, **kw)  # type: ignore[arg-type]


def test_the_newest_version_is_read_with_the_workload_identity_token(standin: tuple[StandIn, str]) -> None:
    state, root = standin
    state.versions = ["hf_old", TOKEN + "\n"]  # `echo ... | gcloud secrets versions add` adds a newline
    assert _read(root) == TOKEN
    assert state.requests == ["/computeMetadata/v1/instance/service-accounts/default/token",
                              f"/v1/{SECRET}/versions/latest:access"]


def test_a_secret_without_a_version_means_anonymous_downloads(standin: tuple[StandIn, str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    _, root = standin
    with caplog.at_level("WARNING", logger="stage-data"):
        assert _read(root) is None
    assert (f"{SECRET} has no version: downloading without a Hugging Face token (public repos only). Add one with "
            "`gcloud secrets versions add verl-gke-a4-hf-token --project my-project-123 --data-file=-`") in caplog.text


def test_permission_denied_is_asked_again_while_iam_applies(standin: tuple[StandIn, str]) -> None:
    state, root = standin
    state.versions, state.denials = [TOKEN], 3
    assert _read(root, deadline_s=60) == TOKEN
    assert state.denials == 0


def test_a_denial_that_lasts_past_the_deadline_is_a_transient_failure(standin: tuple[StandIn, str]) -> None:
    state, root = standin
    state.versions, state.denials = [TOKEN], 10**6
    with pytest.raises(sd.StagingError) as caught:
        _read(root, deadline_s=0)
    assert not caught.value.permanent
    assert str(caught.value) == f"reading the Hugging Face token from {SECRET}: Secret Manager answered 403 PERMISSION_DENIED for {SECRET}"


def test_an_answer_without_the_metadata_flavor_is_not_trusted(standin: tuple[StandIn, str]) -> None:
    state, root = standin
    state.versions, state.flavor = [TOKEN], "Other"
    with pytest.raises(sd.StagingError, match="lacks `Metadata-Flavor: Google`") as caught:
        _read(root)
    assert caught.value.permanent
    assert all("secrets" not in path for path in state.requests)


def test_a_corrupt_payload_is_never_used(standin: tuple[StandIn, str]) -> None:
    state, root = standin
    state.versions, state.corrupt = [TOKEN], True
    with pytest.raises(sd.StagingError, match="fails its CRC32C check"):
        _read(root, deadline_s=0)


def test_an_unreachable_metadata_server_ends_within_the_deadline() -> None:
    with pytest.raises(sd.StagingError, match="GKE metadata server: URLError"):
        sd.read_hf_token(SECRET, metadata_root="http://127.0.0.1:9/computeMetadata/v1", api_root="http://127.0.0.1:9/v1",
                         deadline_s=0, timeout_s=2)


def test_crc32c_is_castagnoli() -> None:
    assert sd.crc32c(b"123456789") == 0xE3069283  # the CRC catalogue's check value for CRC-32C


@pytest.mark.parametrize("name", ["my-project/secrets/x", "projects/p/secrets/a b", "projects/P!/secrets/x"])
def test_the_secret_flag_takes_a_secret_name_only(name: str) -> None:
    with pytest.raises(sd.StagingError, match="--hf-token-secret .* is not a secret name like projects/P/secrets/S"):
        sd.parse_args(["--hf-token-secret", name])


def test_main_redacts_the_token_it_read(standin: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The canary: a Hub failure that quotes the token prints it neither raw nor base64-encoded."""
    state, root = standin
    state.versions = [TOKEN]
    monkeypatch.setattr(sd, "METADATA_ROOT", f"{root}/computeMetadata/v1")
    monkeypatch.setattr(sd, "SECRET_MANAGER_ROOT", f"{root}/v1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
    seen: list[str | None] = []

    class Refusing:
        def list_files(self, repo: str, repo_type: str, revision: str) -> dict[str, int]:
            raise RuntimeError(f"401 for Authorization: Bearer {seen[0]}")

        def download(self, *args: object) -> Path:
            raise AssertionError("never reached")

    real = sd.read_hf_token
    monkeypatch.setattr(sd, "read_hf_token", lambda secret: seen.append(real(secret)) or seen[-1])
    assert sd.main(["--data-root", str(tmp_path), "--hf-token-secret", SECRET], hub=Refusing()) == sd.EXIT_TRANSIENT
    out = capsys.readouterr()
    assert seen == [TOKEN]
    for form in (TOKEN, base64.b64encode(TOKEN.encode()).decode()):
        assert form not in out.out + out.err
    assert out.err.endswith("RuntimeError: 401 for Authorization: Bearer [redacted]\n")


def test_a_gated_model_without_a_token_says_how_to_add_one(
        standin: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, root = standin  # the secret has no version
    monkeypatch.setattr(sd, "METADATA_ROOT", f"{root}/computeMetadata/v1")
    monkeypatch.setattr(sd, "SECRET_MANAGER_ROOT", f"{root}/v1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)

    class GatedRepoError(Exception):
        """Named as huggingface_hub.errors' class, which is what the classifier reads."""

    class Gated:
        def list_files(self, repo: str, repo_type: str, revision: str) -> dict[str, int]:
            raise GatedRepoError("401 Client Error. Cannot access gated repo")

        def download(self, *args: object) -> Path:
            raise AssertionError("never reached")

    assert sd.main(["--data-root", str(tmp_path), "--hf-token-secret", SECRET], hub=Gated()) == sd.EXIT_PERMANENT
    assert capsys.readouterr().err.endswith(
        f"(no Hugging Face token was used: {SECRET} has no version; add one with `gcloud secrets versions add "
        "verl-gke-a4-hf-token --project my-project-123 --data-file=-` and run `pulumi up` again)\n")


# --- who may read it, in every stack -------------------------------------------------------------

def _pod_specs(reg) -> list[tuple[str, dict]]:
    """(what, pod spec) of every pod template a Kubernetes object registers."""
    spec = reg.inputs.get("spec") or {}
    if reg.type == "kubernetes:ray.io/v1:RayCluster":
        return [("ray head", spec["headGroupSpec"]["template"]["spec"]),
                *((f"ray {g['groupName']}", g["template"]["spec"]) for g in spec["workerGroupSpecs"])]
    template = spec.get("template") or {}
    return [(f"{reg.type} {reg.name}", template["spec"])] if "spec" in template else []


@pytest.mark.parametrize("stack", ["a4-standard", "a4x"])  # the x86 and the arm64 (Helm KubeRay, DRA) layouts
def test_only_the_staging_jobs_own_identity_may_read_the_token(synth_stack, stack: str) -> None:
    """The Ray pods (every job, the model export) run as another service account, whose principal holds
    no grant on the secret; nothing but the staging Job runs as staging's; the grant names staging's
    service account object by its UID."""
    from components.gcs_fuse_storage import ksa_principal
    from verl_gke import synth

    regs = synth_stack(stack).registrations
    accounts = {r.inputs["metadata"]["name"]: r.inputs["metadata"] for r in regs
                if r.type == "kubernetes:core/v1:ServiceAccount"}
    project = next(r.inputs["project"] for r in regs if r.type == "gcp:storage/bucket:Bucket")
    principals = {name: ksa_principal(project_number=synth.MOCK_PROJECT_NUMBER, project=project,
                                      uid=synth.mock_uid("ServiceAccount", meta["namespace"], name))
                  for name, meta in accounts.items()}
    runs_as = {what: pod.get("serviceAccountName", "default") for reg in regs for what, pod in _pod_specs(reg)}
    staging = runs_as["kubernetes:batch/v1:Job staging-job"]
    ray = runs_as["ray head"]
    assert staging == f"{ray}-staging"
    assert [what for what, account in runs_as.items() if account == staging] == ["kubernetes:batch/v1:Job staging-job"]
    assert {account for what, account in runs_as.items() if what.startswith("ray ")} == {ray}
    grants = [(r.type.rsplit(":", 1)[-1], r.inputs["role"], r.inputs["member"]) for r in regs
              if r.type.endswith(("IAMMember", "IamMember")) and r.inputs["member"] in principals.values()]
    assert [g for g in grants if g[0] == "SecretIamMember"] == [
        ("SecretIamMember", "roles/secretmanager.secretAccessor", principals[staging])]
    assert {(kind, role) for kind, role, member in grants if member == principals[ray]} == {
        ("BucketIAMMember", "roles/storage.objectViewer"), ("ManagedFolderIamMember", "roles/storage.objectUser")}
    # The run supervisor's account has one grant in GCP, objectUser on logs/ (its copy of the runs'
    # logs, docs/runs.md), and none on the secret; no other account of the stack has any.
    (supervisor,) = [name for name in accounts if name.endswith("-supervisor")]
    assert [g for g in grants if g[2] not in (principals[staging], principals[ray])] == [
        ("ManagedFolderIamMember", "roles/storage.objectUser", principals[supervisor])]
