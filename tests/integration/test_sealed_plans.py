"""Secrets never sit in clear on a node's disk (issue 16, item 9): while a job runs, neither
its `secrets` nor its job token are in any file under the batchyard home (node plans
included; the database holds them sealed), though the ranks get them in their env."""

from __future__ import annotations

import hashlib
import secrets as random_secrets

from yardkit import Yard, wait_until


def test_a_running_jobs_secrets_are_in_no_file(yard: Yard, cluster2: str) -> None:
    value = "s3cret-" + random_secrets.token_hex(12)
    digest = hashlib.sha256(value.encode()).hexdigest()
    shared, mount = yard.exchange("sealed")  # (outside the home: the token lands there)
    seen = shared / "sealed-seen"
    release = yard.work / "sealed-release"
    job = yard.write_job("sealed", {
        "name": "sealed", "nodes": 2, "distribution": {"type": "pytorch",
                                                       "processes_per_node": 1},
        "secrets": {"TOKEN_A": value}, "mounts": [mount],
        # the command names the secret by its digest only: it is stored and shown as given
        "command": f'[ "$(printf %s "$TOKEN_A" | sha256sum | cut -c1-64)" = "{digest}" ] && '
                   f'printf %s "$BATCHYARD_TOKEN" > {seen}.$RANK && '
                   f"until [ -e {release} ]; do sleep 0.1; done"})
    yard.ok("job", "create", "-f", str(job), "-c", cluster2)
    wait_until(lambda: all((shared / f"sealed-seen.{r}").exists() for r in (0, 1)), 120,
               what="both ranks to see their secret")
    token = (shared / "sealed-seen.0").read_text()
    assert token.startswith("job.")
    leaks = [str(p) for p in yard.home.rglob("*") if p.is_file() and not p.is_symlink()
             and (value.encode() in (blob := p.read_bytes()) or token.encode() in blob)]
    release.touch()
    assert yard.wait_job("sealed", timeout=120)["state"] == "succeeded"
    assert not leaks, f"a secret is in clear in {leaks}"
