"""The local proxy in front of the port-forward, against a real Ray head with token authentication
(Ray 2.60 here; KubeRay sets the same RAY_AUTH_MODE and RAY_AUTH_TOKEN on its pods): the CLI's own
requests pass (plain HTTP and the log tail's WebSocket), with the token added by the proxy; requests
a web page in a browser could make are refused before they reach the head."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.ray_head import HEAD_ENV, RayHead, start_head, stop_head
from access.head_access import job_client, wait_for_dashboard
from access.local_proxy import LocalProxy

pytestmark = pytest.mark.ray
TOKEN = secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def token_head() -> Iterator[RayHead]:
    head = start_head(env={**HEAD_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})
    try:
        yield head
    finally:
        stop_head(head, grace_s=5.0)


@pytest.fixture
def proxy(token_head: RayHead) -> Iterator[tuple[str, LocalProxy]]:
    port = urlsplit(token_head.dashboard_url).port
    assert port is not None
    p = LocalProxy(port, TOKEN)
    with p as url:
        yield url, p


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET",
         body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode(errors="replace")


def test_the_head_wants_its_token(token_head: RayHead) -> None:
    assert _get(f"{token_head.dashboard_url}/api/version")[0] == 401


def test_the_clis_own_requests_pass_with_the_token_added(proxy: tuple[str, LocalProxy]) -> None:
    url, _ = proxy
    wait_for_dashboard(url, 30)
    client = job_client(url, "the test head")
    submission_id = client.submit_job(entrypoint="echo proxied")
    lines: list[str] = []

    async def tail() -> None:  # Ray's log tail is a WebSocket: the upgrade passes the proxy too
        async for chunk in client.tail_job_logs(submission_id):
            lines.append(chunk)

    asyncio.run(asyncio.wait_for(tail(), 60))
    assert "proxied" in "".join(lines)
    assert str(client.get_job_status(submission_id)) == "SUCCEEDED"


@pytest.mark.parametrize("path, headers, why", [
    ("/api/jobs/", {}, "no session secret in the path"),
    ("/{wrong}/api/jobs/", {}, "no session secret in the path"),
    ("/{secret}/api/jobs/", {"Host": "rebound.evil.example:{port}"}, "Host 'rebound.evil.example:{port}' is not this proxy's"),
    ("/{secret}/api/jobs/", {"Origin": "https://evil.example"}, "Origin 'https://evil.example' is another site"),
    ("/{secret}/api/jobs/", {"Origin": "null"}, "Origin 'null' is another site"),
    ("/{secret}/api/jobs/", {"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site 'cross-site': a request from another site"),
    ("/{secret}/api/jobs/", {"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site 'same-site': a request from another site"),
])
def test_what_a_web_page_could_send_is_refused_before_the_head(proxy: tuple[str, LocalProxy], token_head: RayHead,
                                                             path: str, headers: dict[str, str], why: str) -> None:
    url, p = proxy
    secret = urlsplit(url).path.strip("/")
    fill = {"secret": secret, "wrong": secrets.token_urlsafe(32), "port": p.port}
    before = len(job_client(url, "the test head").list_jobs())
    body = json.dumps({"entrypoint": "touch /tmp/pwned"}).encode()
    status, text = _get(f"http://127.0.0.1:{p.port}{path.format(**fill)}",
                        {k: v.format(**fill) for k, v in headers.items()} | {"Content-Type": "application/json"},
                        "POST", body)
    assert (status, text) == (403, f"verl-gke's local proxy refused the request: {why.format(**fill)}\n")
    assert len(job_client(url, "the test head").list_jobs()) == before


def test_the_dashboard_opens_in_your_own_browser_under_the_secret(proxy: tuple[str, LocalProxy]) -> None:
    url, p = proxy
    typed = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "User-Agent": "Mozilla/5.0 (X11) Firefox/140.0"}
    request = urllib.request.Request(url, headers=typed)
    opener = urllib.request.build_opener(type("NoRedirect", (urllib.request.HTTPRedirectHandler,), {
        "redirect_request": lambda *a, **k: None}))
    with pytest.raises(urllib.error.HTTPError) as redirected:
        opener.open(request, timeout=30)
    assert (redirected.value.code, redirected.value.headers["Location"]) == (308, f"{urlsplit(url).path}/")
    status, page = _get(f"{url}/", typed)
    assert status == 200 and "<html" in page.lower()
    own_page = {"Sec-Fetch-Site": "same-origin", "Origin": f"http://127.0.0.1:{p.port}"}
    assert _get(f"{url}/api/version", own_page)[0] == 200


def test_the_proxy_ends_with_its_block(token_head: RayHead) -> None:
    port = urlsplit(token_head.dashboard_url).port
    assert port is not None
    with LocalProxy(port, TOKEN) as url:
        wait_for_dashboard(url, 30)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", urlsplit(url).port or 0), timeout=5).close()


def test_the_supervisor_sends_the_token_kuberay_gives_its_pod(token_head: RayHead,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.run_lifecycle import RayJobs

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with pytest.raises(urllib.error.HTTPError) as refused:
        RayJobs(token_head.dashboard_url).jobs()
    assert refused.value.code == 401
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    assert isinstance(RayJobs(token_head.dashboard_url).jobs(), dict)
