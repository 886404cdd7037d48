"""`batchyard login` on a server with single sign-on: the device authorization grant (RFC
8628), as `az login --use-device-code`. The server asks the provider for a code; this prints
where to enter it (a browser on any machine: a headless login node needs none), then polls
the server until the user has signed in there, and gets a batchyard login token back. The
CLI never talks to the provider itself, so it needs to reach only the batchyard server.

Registered in ``client.signin.FLOWS`` under the method kind ``oidc``."""

from __future__ import annotations

import sys
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from batchyard import errors
from batchyard.client.http import Client
from batchyard.client.signin import FLOWS, Ask

MAX_WAIT = 1800.0


def device_flow(url: str, method: dict[str, Any], ask: Ask) -> str:
    """A login token of ``url`` once the user has signed in at the provider."""
    c = Client(url, None)
    try:
        started = c.post("/auth/oidc/device")
        _tell(started, method)
        return _poll(c, started)
    finally:
        c.close()


def _tell(started: dict[str, Any], method: dict[str, Any]) -> None:
    uri, code = started.get("verification_uri"), started.get("user_code")
    lines = [f"To sign in, use a web browser to open the page {uri} and enter the code "
             f"{code} to authenticate."]
    if started.get("verification_uri_complete"):
        lines.append(f"(or open {started['verification_uri_complete']}, which holds the "
                     "code)")
    if method.get("issuer"):
        lines.append(f"Single sign-on with {method['issuer']}; this code expires in "
                     f"{float(started.get('expires_in') or 600) / 60:.0f} minutes.")
    print("\n".join(lines), file=sys.stderr, flush=True)


def _poll(c: Client, started: dict[str, Any]) -> str:
    interval = float(started.get("interval") or 5)
    deadline = time.monotonic() + min(MAX_WAIT, float(started.get("expires_in") or 600) + 30)
    with _waiting():
        while True:
            time.sleep(max(0.5, interval))
            if time.monotonic() > deadline:
                raise errors.AuthError("the code was not entered in time: run `batchyard "
                                       "login` again")
            answer = c.post("/auth/oidc/device/token", {"request": started["request"]})
            if answer.get("status") == "done" and answer.get("token"):
                return str(answer["token"])
            interval = float(answer.get("interval") or interval)


def _waiting() -> AbstractContextManager[Any]:
    """A spinner on a terminal's stderr while the user signs in elsewhere."""
    if not sys.stderr.isatty():
        return nullcontext()
    from rich.console import Console

    return Console(stderr=True).status("waiting for the sign-in in the browser… "
                                       "(Ctrl-C to give up)")


FLOWS["oidc"] = device_flow
