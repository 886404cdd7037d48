"""Submits/s with a user's personal token against the admin's (bench/api_load.py, issue 32):
the cost of authorising a user rather than the home's token. Rounds alternate between the
two tokens, and which goes first alternates too, so that a noisy moment of a shared machine
hits both alike; the medians are compared. Beside the rates, the server's own CPU time per
submit (all its processes), which other load on the machine disturbs much less."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Coroutine
from typing import Any

# api_load.submits: (url, headers, clients, total, experiment) -> its figures
Submits = Callable[..., Coroutine[Any, Any, dict[str, Any]]]


def personal_token(http: Any) -> dict[str, str]:
    """A user who is a contributor of the workspace, and their personal token's header."""
    for path, body in (("/users", {"name": "bench-user"}),
                       ("/workspaces/default/roles", {"user": "bench-user",
                                                      "role": "contributor"})):
        resp = http.post(path, json=body)
        assert resp.status_code in (200, 201, 409), resp.text
    resp = http.post("/users/bench-user/tokens", json={"name": "api_load"})
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['token']}"}


def token_rounds(submits: Submits, url: str, admin: dict[str, str],
                 personal: dict[str, str], clients: int, total: int, rounds: int,
                 server_cpu: Callable[[], float]) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"admin": [], "personal": []}
    cpu: dict[str, list[float]] = {"admin": [], "personal": []}
    errors = {"admin": 0, "personal": 0}
    pair = [("admin", admin), ("personal", personal)]
    for n in range(rounds):
        for who, headers in pair if n % 2 == 0 else pair[::-1]:
            before = server_cpu()
            got = asyncio.run(submits(url, headers, clients, total, f"tok-{who}-{n}"))
            cpu[who].append((server_cpu() - before) / max(1, got["ok"]))
            rates[who].append(got["rate"])
            errors[who] += sum(got["errors"].values())
    found = {"clients": clients, "per_round": total, "rounds": rounds, "rates": rates,
             "cpu_per_submit": cpu, "errors": errors}
    for who in ("admin", "personal"):
        found[who] = statistics.median(rates[who])
        found[f"{who}_cpu"] = statistics.median(cpu[who])
    found["ratio"] = found["personal"] / found["admin"] if found["admin"] else float("nan")
    found["cpu_ratio"] = found["admin_cpu"] / found["personal_cpu"] \
        if found["personal_cpu"] else float("nan")
    return found


def report_tokens(t: dict[str, Any]) -> None:
    for who in ("admin", "personal"):
        print(f"{'submit, ' + who + ' token (median)':<44}{t[who]:>11.0f}/s   "
              f"server CPU {t[who + '_cpu'] * 1000:.2f} ms/submit; rounds: "
              + " ".join(f"{r:.0f}" for r in t["rates"][who]))
    print(f"{'personal / admin submits/s':<44}{t['ratio']:>12.3f}x   (at least 0.95; "
          f"{t['rounds']} rounds of {t['per_round']} at {t['clients']} clients each)")
    print(f"{'same, by server CPU per submit':<44}{t['cpu_ratio']:>12.3f}x   (errors: admin "
          f"{t['errors']['admin']}, personal {t['errors']['personal']})")
