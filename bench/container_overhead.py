"""Job create -> every rank in user code, the same 2x2 job with and without a container, in
one run (and a bare ``docker run`` + ``docker exec`` of one process, the runtime's own floor).

Each rank of examples/hello-distributed records the time its user code started
(``--rendezvous``, into a local mount both kinds of job see at the same path). The figure is
from just before the job-create HTTP call to the last rank's start. The container job pays
for one ``docker run`` per node and one ``docker exec`` per process; the image is already on
the nodes (pull time is the registry's, not batchyard's).

    python bench/container_overhead.py [--runs 10] [--engine docker|podman]

Needs root and the container kit's runtimes (scripts/setup.sh installs them); it starts its
own dockerd (or Podman store) and builds the kit's base image if it is not cached.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _harness import ROOT, isolated_server, median, wait_files

HELLO = ROOT / "examples" / "hello-distributed"


def through_batchyard(client: object, image: str | None, i: int) -> float:
    from batchyard.client.http import Client

    assert isinstance(client, Client)
    rendezvous = Path(tempfile.mkdtemp(prefix="bench-rv-"))
    name = f"bench-{'boxed' if image else 'bare'}-{i}"
    spec = {"nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
            "code": str(HELLO),
            "mounts": [{"kind": "local", "relative_path": "rv", "source": str(rendezvous)}],
            "command": "python hello.py --rendezvous $AZ_BATCHAI_JOB_MOUNT_ROOT/rv"}
    if image:
        spec["environment"] = {"image": image}
    t0 = time.time()
    client.post("/workspaces/default/jobs", {"spec": spec, "cluster": "c2", "name": name})
    ranks = wait_files(rendezvous, 4, timeout=120)
    start = max(float(r["started_at"]) for r in ranks)  # type: ignore[arg-type]
    path = client.job_path("default", "default", name)
    while (job := client.get(path))["state"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.05)
    if job["state"] != "succeeded":
        raise SystemExit(f"{name} {job['state']}: {job.get('message')}")
    shutil.rmtree(rendezvous, ignore_errors=True)
    return start - t0


def bare_runtime(cli: list[str], env: dict[str, str], image: str) -> float:
    """``run -d`` + ``exec python3 -c pass`` + ``rm -f``: what one node's container costs
    before any batchyard code, measured to the end of the exec."""
    t0 = time.time()
    name = f"bench-bare-{os.getpid()}"
    subprocess.run([*cli, "run", "-d", "--rm", "--name", name, "--network", "host", "--init",
                    "--entrypoint", "sleep", image, "infinity"], check=True, env=env,
                   capture_output=True)
    subprocess.run([*cli, "exec", name, "python3", "-c", "pass"], check=True, env=env)
    took = time.time() - t0
    subprocess.run([*cli, "rm", "-f", name], env=env, capture_output=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--engine", choices=("docker", "podman"), default="docker")
    args = parser.parse_args()
    from containerkit import DockerEngine, ImageKit, PodmanEngine

    engine = DockerEngine().start() if args.engine == "docker" else PodmanEngine().start()
    try:
        image = ImageKit().name("base", engine)
        os.environ.update(engine.env)
        os.environ["BATCHYARD_CONTAINER_RUNTIME"] = engine.name
        with isolated_server():
            from batchyard.client.http import Client

            client = Client.connect(quiet=True)
            client.post("/workspaces/default/clusters", {"name": "c2",
                                                         "vm_size": "Standard_D2_v2",
                                                         "manual": {"target_node_count": 2}})
            deadline = time.time() + 60
            while time.time() < deadline:
                nodes = client.get("/workspaces/default/clusters/c2/nodes")
                if len([n for n in nodes if n["state"] == "idle"]) == 2:
                    break
                time.sleep(0.2)
            through_batchyard(client, None, 0)  # warm-up: imports, page cache
            through_batchyard(client, image, 0)
            bare, boxed, floor = [], [], []
            for i in range(1, args.runs + 1):
                bare.append(through_batchyard(client, None, i))
                boxed.append(through_batchyard(client, image, i))
                floor.append(bare_runtime(engine.cli, engine.full_env(), image))
    finally:
        engine.close()
    b, c, f = median(bare), median(boxed), median(floor)
    print(f"{args.runs} runs each, 2 nodes x 2 ranks, {engine.name}, medians:")
    print(f"  without a container  {b:6.3f} s")
    print(f"  in a container       {c:6.3f} s   overhead {c - b:+.3f} s ({c / b:.2f}x)")
    print(f"  bare {engine.name} run+exec+rm of one process {f:6.3f} s (the runtime's floor)")


if __name__ == "__main__":
    main()
