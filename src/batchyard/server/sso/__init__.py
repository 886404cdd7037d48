"""Single sign-on with OpenID Connect (issue 32).

`batchyard server start --oidc-issuer URL --oidc-client-id ID` makes the server a client of
an OpenID provider. The CLI signs in with the device authorization grant (RFC 8628), which
this server runs with the provider on the CLI's behalf (the CLI needs no browser and never
reaches the provider; the client secret stays here); the portal signs in with the
authorization code flow and PKCE. Both end in ``signin.sign_in``: the ID token verified
(``idtoken``), the user found by (issuer, subject) or made, admins and roles from the
``groups`` claim, and a batchyard credential issued (a login token for the CLI, a portal
session for the browser).

Modules: ``settings`` (the flags), ``provider`` (HTTP to the provider), ``idtoken``,
``signin`` (users and roles), ``flows`` (the device and code flows' state)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from batchyard.errors import NotFound
from batchyard.server.context import ServerContext

if TYPE_CHECKING:
    from batchyard.server.sso.provider import Provider
    from batchyard.server.sso.settings import OidcSettings

NOT_CONFIGURED = ("single sign-on is not configured on this server (it was started without "
                  "--oidc-issuer): sign in with a personal token")


def install(ctx: ServerContext, settings: OidcSettings | None) -> None:
    """Make this server process sign people in through ``settings``' provider (None: no
    single sign-on) and say so to clients (``GET /api/v1/auth/methods``)."""
    if settings is None:
        return
    from batchyard.server.sso.provider import Provider

    ctx.oidc = Provider(settings)
    ctx.login_methods = [{"kind": "oidc", "flow": "device", "issuer": settings.issuer,
                          "client_id": settings.client_id, "portal": "/login/sso"},
                         *[m for m in ctx.login_methods if m.get("kind") != "oidc"]]


def provider_of(ctx: ServerContext) -> Provider:
    found: Provider | None = ctx.oidc
    if found is None:
        raise NotFound(NOT_CONFIGURED)
    return found
