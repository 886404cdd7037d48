"""The launcher's container steps: pull, start the node's container, wrap every job process
in ``exec``, and remove the container whatever way the attempt ends (node/container.py says
why one container per node). Host steps (mount commands, stage-in, uploads) stay outside."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from batchyard.failure_record import IMAGE_PULL, PREPARATION
from batchyard.node import container
from batchyard.node.env import NodeDirs
from batchyard.node.plan import NodePlan

# `bash -c CMD ARGS...` as it runs in an image: bash if the image has it, else sh
SHELL = ('if command -v bash >/dev/null 2>&1; then exec bash -c "$0" "$@"; '
         'else exec sh -c "$0" "$@"; fi')


class Boxed:
    plan: NodePlan
    box: str | None = None  # the running container's name
    runtime: container.Runtime | None = None

    def say(self, message: str) -> None:  # the launcher's
        raise NotImplementedError

    def write_status(self, **changes: Any) -> None:  # the launcher's
        raise NotImplementedError

    @property
    def boxed(self) -> bool:
        return bool(self.plan.container and self.plan.container.get("image"))

    def box_mounts(self, dirs: NodeDirs) -> list[tuple[str, str]]:
        """Every host directory a job process may be told about, at the same path inside:
        read-write only the job's own (and its mounts'), inputs read-only, nothing else of
        the host (the job may be root in its image)."""
        plan = self.plan
        job_local = dirs.job_mount_root.parent
        paths = [str(job_local), plan.attempt_dir, plan.checkpoint_dir, str(dirs.mount_root),
                 str(dirs.stdouterr), *(str(p) for p in dirs.outputs.values())]
        for mount in plan.mounts:
            source = str(mount.get("source") or "")
            if mount.get("kind") == "local" and source.startswith("/") and os.path.isdir(source):
                paths.append(source)
        read_only = [value for value in dirs.inputs.values()
                     if value.startswith("/") and os.path.exists(value)]
        if plan.ca_file:
            read_only.append(plan.ca_file)
        if plan.dist_type in ("mpi", "custom"):
            from batchyard.node import rsh

            read_only.append(str(Path(rsh.__file__).resolve().parent))
        return container.binds(paths, read_only)

    def box_run_argv(self, dirs: NodeDirs, runtime_name: str, cli: list[str],
                     image: str | None = None) -> list[str]:
        plan = self.plan
        spec = plan.container or {}
        return container.run_argv(
            runtime_name, cli, image=image or str(spec["image"]),
            name=container.container_name(plan.attempt_uuid, plan.node_rank),
            attempt_uuid=plan.attempt_uuid, node_rank=plan.node_rank, job_name=plan.job_name,
            mounts=self.box_mounts(dirs), shm=spec.get("shm_size"), gpus=plan.gpus,
            user=f"{os.getuid()}:{os.getgid()}", pids=plan.max_pids)

    def start_box(self, dirs: NodeDirs, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
        """Pull (per the job's policy) and start this node's container; a failure ends the
        attempt in preparing with the runtime's or the registry's own words."""
        plan = self.plan
        spec = plan.container or {}
        image = str(spec["image"])
        where = f"on node {plan.node_name}"
        runtime = container.find_runtime()
        if runtime is None:
            return "failed", {"message": f"node {plan.node_name} {container.NO_RUNTIME} "
                              f"(image {image})", "cause": IMAGE_PULL}
        self.runtime = runtime
        scratch = Path(plan.node_dir) / "tmp" / f"auth-{plan.attempt_uuid}-{plan.node_rank}"
        self.say(f"container runtime {runtime.name} {runtime.version}; image {image} "
                 f"(pull policy {spec.get('pull_policy') or 'if_missing'})")
        named = container.effective_image(runtime, image, dict(os.environ))
        if named != image:
            self.say(f"image {image} is a short name: {named}, as Docker reads it (this "
                     "node's registries configuration has no alias or search registry for it)")
            image = named
        try:
            done, image_env = container.ensure_image(
                runtime, image, str(spec.get("pull_policy") or "if_missing"),
                spec.get("registry"), scratch, dict(os.environ))
            self.say(f"image {image}: {done}")
            if done == "pulled":
                self.write_status(containers=container.describe(runtime))
            argv = self.box_run_argv(dirs, runtime.name, list(runtime.cli), image)
            self.say("container: " + container.render(argv))
            container.start(runtime, argv, dict(os.environ))
        except container.PullError as exc:
            return "failed", {"message": f"{where}: {exc}", "cause": IMAGE_PULL}
        except container.StartError as exc:
            return "failed", {"message": f"{where}: {exc}", "cause": PREPARATION}
        self.box = container.container_name(plan.attempt_uuid, plan.node_rank)
        self._python_inside(dirs, env, image_env)
        if plan.dist_type in ("mpi", "custom") and not plan.distribution.get("mpi_flavour"):
            self._mpi_inside(dirs, env)
        return "ready", {}

    def _mpi_inside(self, dirs: NodeDirs, env: dict[str, str]) -> None:
        """The image's MPI decides the flavour: ask its ``mpirun --version`` in the
        container, then write the hostfile and the MPI variables for that flavour."""
        import subprocess

        from batchyard.node import mpi
        from batchyard.node.env import node_env

        def inside(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
            kwargs["env"] = {**os.environ, **env}
            return subprocess.run(self.boxed_argv(argv, env, dirs.workdir), **kwargs)

        flavour = mpi.resolve_flavour(self.plan, mpirun="mpirun", run=inside)
        self.say(f"MPI in the image: {flavour}")
        dirs.hostfile.write_text("".join(f"{line}\n" for line in
                                         mpi.hostfile_lines(self.plan, flavour)))
        path = env.get("PATH")
        env.update(node_env(self.plan, dirs))
        if path:
            env["PATH"] = path

    def _python_inside(self, dirs: NodeDirs, env: dict[str, str],
                       image_env: dict[str, str]) -> None:
        """``python`` in commands means the image's: environment.python when the job names
        one (first on PATH), else the image's own, and its ``python3`` where the image has
        no ``python`` (a shim last on PATH: Batch AI's images all had one)."""
        plan = self.plan
        image_path = image_env.get(
            "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        bindir = dirs.job_temp / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        target = plan.python or "python3"
        for name in ("python", "python3") if plan.python else ("python",):
            shim = bindir / name
            shim.write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
            shim.chmod(0o755)
        env["PATH"] = f"{bindir}:{image_path}" if plan.python else f"{image_path}:{bindir}"

    def boxed_argv(self, argv: list[str], env: dict[str, str], cwd: Path) -> list[str]:
        assert self.runtime is not None and self.box is not None
        if argv[:2] == ["bash", "-c"] and len(argv) >= 3:
            # bash where the image has it, else sh (busybox, Alpine), decided in the
            # container itself: no extra round trip before the first rank
            argv = ["sh", "-c", SHELL, argv[2], *argv[3:]]
        return container.exec_argv(list(self.runtime.cli), self.box, list(env), str(cwd), argv)

    def stop_box(self) -> None:
        if self.runtime is not None and self.box is not None:
            container.remove(self.runtime, self.box)
            self.say(f"removed container {self.box}")
            self.box = None
