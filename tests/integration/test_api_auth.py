"""Every API route needs the bearer token: none or a wrong one gets 401 (CVE-2023-48022 is
what an unauthenticated job API leads to). The OpenAPI document is published."""

from __future__ import annotations

import stat

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)

JOB = "/api/v1/workspaces/default/experiments/default/jobs/some-job"
ROUTES = [
    ("GET", "/api/v1/health"),
    ("GET", "/api/v1/workspaces"),
    ("POST", "/api/v1/workspaces"),
    ("GET", "/api/v1/workspaces/default"),
    ("GET", "/api/v1/workspaces/default/clusters"),
    ("POST", "/api/v1/workspaces/default/clusters"),
    ("GET", "/api/v1/workspaces/default/clusters/local2/nodes"),
    ("POST", "/api/v1/workspaces/default/clusters/local2/nodes/local2-0/exec"),
    ("GET", "/api/v1/workspaces/default/experiments"),
    ("POST", "/api/v1/workspaces/default/jobs"),
    ("GET", "/api/v1/workspaces/default/jobs"),
    ("GET", JOB),
    ("DELETE", JOB),
    ("POST", JOB + "/terminate"),
    ("GET", JOB + "/logs"),
    ("GET", JOB + "/files"),
    ("GET", JOB + "/files/content?path=stdouterr/x"),
    ("GET", "/api/v1/schema/job"),
    ("POST", "/api/v1/snapshots"),
    ("POST", "/api/v1/portal/sign-in-links"),  # a portal sign-in for whoever asks: never
]


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
@pytest.mark.parametrize("auth", ["none", "wrong", "not-bearer"])
def test_route_needs_the_token(yard, method, path, auth):
    headers = {"none": {}, "wrong": {"Authorization": "Bearer not-the-token"},
               "not-bearer": {"Authorization": f"Basic {yard.token}"}}[auth]
    body = {"argv": ["touch", "/tmp/should-never-exist"]} if path.endswith("/exec") else {}
    resp = httpx.request(method, yard.url + path, headers=headers, json=body, timeout=10)
    assert resp.status_code == 401, (resp.status_code, resp.text)
    assert resp.json()["error"]["code"] == "unauthorized"
    assert "Traceback" not in resp.text


def test_the_token_opens_them(yard, cluster2):
    ok = httpx.get(yard.url + "/api/v1/workspaces",
                   headers={"Authorization": f"Bearer {yard.token}"}, timeout=10)
    assert ok.status_code == 200 and any(w["name"] == "default" for w in ok.json())
    missing = httpx.get(yard.url + JOB, headers={"Authorization": f"Bearer {yard.token}"},
                        timeout=10)
    assert missing.status_code == 404  # past auth, to the real answer


def test_token_file_is_private(yard):
    mode = stat.S_IMODE((yard.home / "token").stat().st_mode)
    assert mode == 0o600, oct(mode)


def test_server_binds_loopback(yard):
    assert yard.url.startswith("http://127.0.0.1:")


def test_openapi_published(yard):
    resp = httpx.get(yard.url + "/api/v1/openapi.json", timeout=10)
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    assert "/api/v1/workspaces" in paths
    assert "/api/v1/workspaces/{ws}/jobs" in paths
    assert any(p.endswith("/terminate") for p in paths)
