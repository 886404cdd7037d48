"""azureml.core.authentication: who a workspace acts as.

* ``InteractiveLoginAuthentication()`` is a `batchyard login`: the login stored for the
  server (BATCHYARD_SERVER, ``server=``, else the last login's server) is used; with none
  stored, or ``force=True``, it signs in (the server's sign-in flow, else a personal token
  asked for at the terminal) and stores the login as the CLI does. On the embedded default
  (no server configured, no login) it is the local server and the home's token: nothing
  to ask.
* ``ServicePrincipalAuthentication(tenant_id, service_principal_id,
  service_principal_password)`` is a service account's token: the password is the token,
  the id its name (checked with the server at first use); ``tenant_id`` has nothing to name
  here and is accepted.

Pass either as ``auth=`` to ``Workspace(...)``, ``Workspace.get``, ``.create`` or
``.from_config``."""

from __future__ import annotations

import getpass
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from batchyard import errors
from batchyard.compat.azureml.exceptions import AuthenticationException

if TYPE_CHECKING:
    from batchyard.client.http import Client


class AbstractAuthentication(ABC):
    def __init__(self) -> None:
        self._client: Client | None = None

    def client(self) -> Client:
        if self._client is None:
            self._client = self._connect()
        return self._client

    @abstractmethod
    def _connect(self) -> Client:
        """The client this authentication signs in with."""

    def get_authentication_header(self) -> dict[str, str]:
        token = self.client().token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def whoami(self) -> dict[str, Any]:
        """Who the server takes this authentication for."""
        try:
            found: dict[str, Any] = self.client().get("/auth/me")
        except errors.AuthError as exc:
            raise AuthenticationException(exc.message) from None
        return found


class InteractiveLoginAuthentication(AbstractAuthentication):
    def __init__(self, force: bool = False, tenant_id: str | None = None,
                 cloud: str | None = None, *, server: str | None = None) -> None:
        super().__init__()
        self.force = force
        self.server = server

    def _connect(self) -> Client:
        from batchyard.client import credentials, signin
        from batchyard.client.http import Client

        url = self.server or os.environ.get("BATCHYARD_SERVER") or (
            credentials.current() or (None,))[0]
        if url is None:
            if self.force:
                raise AuthenticationException("force=True: name the server to sign in to "
                                              "(server=URL or BATCHYARD_SERVER)")
            return Client.connect()  # the embedded default: the home's token
        if self.force or not (os.environ.get("BATCHYARD_TOKEN") or
                              credentials.token_for(url)):
            try:
                signin.sign_in(url, None, getpass.getpass)
            except errors.BatchyardError as exc:
                raise AuthenticationException(f"signing in to {url} failed: "
                                              f"{exc.message}") from None
        return signin.client_for(url)


class ServicePrincipalAuthentication(AbstractAuthentication):
    def __init__(self, tenant_id: str | None, service_principal_id: str,
                 service_principal_password: str, cloud: str = "AzureCloud",
                 _enable_caching: bool = True, *, server: str | None = None) -> None:
        super().__init__()
        if not service_principal_password:
            raise AuthenticationException("service_principal_password: the service "
                                          "account's token (`batchyard token create --user "
                                          f"{service_principal_id}`)")
        self.service_principal_id = service_principal_id
        self.server = server
        self._token = service_principal_password

    def _connect(self) -> Client:
        from batchyard.client import signin

        client = signin.client_for(self.server, self._token)
        try:
            who = client.get("/auth/me")
        except errors.BatchyardError as exc:
            raise AuthenticationException(f"the service principal's token was refused: "
                                          f"{exc.message}") from None
        if who.get("name") != self.service_principal_id:
            raise AuthenticationException(
                f"service_principal_id {self.service_principal_id!r}: the token belongs to "
                f"{who.get('name')!r}")
        return client


def client_of(auth: Any) -> Client | None:
    """The client an ``auth=`` argument stands for (None: the default one)."""
    if auth is None:
        return None
    if isinstance(auth, AbstractAuthentication):
        return auth.client()
    raise AuthenticationException(f"auth: {type(auth).__name__} is not an authentication "
                                  "batchyard knows (InteractiveLoginAuthentication, "
                                  "ServicePrincipalAuthentication)")
