"""The AML compat's authentications against a real server (issue 32):
``InteractiveLoginAuthentication`` is a `batchyard login` (the stored login; on the
embedded default, the home's token with nothing to ask) and
``ServicePrincipalAuthentication`` a service account's token, checked against its name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from batchyard.compat.azureml.core.authentication import (
    InteractiveLoginAuthentication,
    ServicePrincipalAuthentication,
)
from batchyard.compat.azureml.core.workspace import Workspace
from batchyard.compat.azureml.exceptions import AuthenticationException, ProjectSystemException
from batchyard.sdk import set_default_client
from yardkit import Yard

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def env(yard: Yard) -> Iterator[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        yard.ok("workspace", "create", "aml-a")
        yard.ok("workspace", "create", "aml-b")
        yard.ok("user", "create", "ci-bot", "--service")
        yard.ok("user", "create", "dana")
        yard.ok("role", "assign", "-w", "aml-a", "--user", "ci-bot", "--role", "contributor")
        yard.ok("role", "assign", "-w", "aml-b", "--user", "dana", "--role", "reader")
        tokens = {who: yard.js("token", "create", "--user", who)["token"]
                  for who in ("ci-bot", "dana")}
        yield {"yard": yard, **tokens}
        set_default_client(None)


def test_a_service_principal_is_a_service_accounts_token(env: dict[str, Any]) -> None:
    auth = ServicePrincipalAuthentication(tenant_id="ignored", service_principal_id="ci-bot",
                                          service_principal_password=env["ci-bot"])
    ws = Workspace.get("aml-a", auth=auth)
    assert ws.name == "aml-a"
    assert auth.whoami()["service"] is True
    assert auth.get_authentication_header() == {"Authorization": f"Bearer {env['ci-bot']}"}
    assert set(Workspace.list(auth=auth)) == {"aml-a"}  # where it has a role, only
    with pytest.raises(ProjectSystemException):
        Workspace.get("aml-b", auth=auth)
    wrong = ServicePrincipalAuthentication(None, "someone-else", env["ci-bot"])
    with pytest.raises(AuthenticationException, match="belongs to 'ci-bot'"):
        Workspace.get("aml-a", auth=wrong)
    refused = ServicePrincipalAuthentication(None, "ci-bot", "pat.not-a-token")
    with pytest.raises(AuthenticationException, match="refused"):
        Workspace.get("aml-a", auth=refused)


def test_interactive_login_is_the_stored_login(env: dict[str, Any]) -> None:
    yard: Yard = env["yard"]
    # the embedded default: nothing to ask, the home's token (an admin)
    assert InteractiveLoginAuthentication().whoami()["credential"] == "home-token"
    done = yard.cli("login", "--server", yard.url, "--with-token", stdin=env["dana"] + "\n")
    assert done.rc == 0, str(done)
    try:
        auth = InteractiveLoginAuthentication()
        assert auth.whoami()["name"] == "dana"
        ws = Workspace(workspace_name="aml-b", auth=auth)
        assert ws.name == "aml-b"
        assert set(Workspace.list(auth=auth)) == {"aml-b"}
    finally:
        yard.ok("logout")
