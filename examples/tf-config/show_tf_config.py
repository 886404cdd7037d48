"""Print and check the TensorFlow cluster description each task gets; no TensorFlow needed.

batchyard gives every rank of a ``tensorflow`` job TF_CONFIG (cluster with chief / worker / ps
lists and this task's type and index; the chief is Batch AI's master, as tf.estimator expects)
and Batch AI's AZ_BATCHAI_WORKER_HOSTS / AZ_BATCHAI_PS_HOSTS (comma-separated host:port). This
script prints them and checks that they describe one consistent cluster; it exits 1 naming
any mismatch. It also accepts the Batch AI recipes' command line
(``--job_name worker --task_index $AZ_BATCHAI_TASK_INDEX --ps_hosts ... --worker_hosts ...``)
and checks it against the same cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

STARTED_AT = time.time()
TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def hosts(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [h.strip() for h in text.split(",") if h.strip()]


def check_tf_config(tf_config: Any) -> list[str]:
    errors: list[str] = []
    if not isinstance(tf_config, dict):
        return ["TF_CONFIG is not a JSON object"]
    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        return ["TF_CONFIG.cluster is missing or empty"]
    if not isinstance(task, dict):
        return ["TF_CONFIG.task is missing"]
    for kind, members in cluster.items():
        if kind not in TASK_TYPES:
            errors.append(f"TF_CONFIG.cluster has unknown task type {kind!r}")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            errors.append(f"TF_CONFIG.cluster.{kind} is not a list of host:port strings")
            continue
        for member in members:
            host, _, port = member.rpartition(":")
            if not host or not port.isdigit():
                errors.append(f"TF_CONFIG.cluster.{kind}: {member!r} is not host:port")
    if len(cluster.get("chief", [])) > 1:
        errors.append(f"TF_CONFIG.cluster.chief has {len(cluster['chief'])} tasks; at most 1")
    if "master" in cluster or task.get("type") == "master":
        errors.append("TF_CONFIG uses 'master'; tf.estimator expects 'chief'")
    everyone = [m for ms in cluster.values() if isinstance(ms, list) for m in ms]
    duplicates = sorted({m for m in everyone if everyone.count(m) > 1})
    if duplicates:
        errors.append(f"TF_CONFIG.cluster lists {', '.join(duplicates)} more than once")
    kind, index = task.get("type"), task.get("index")
    if kind not in cluster:
        errors.append(f"TF_CONFIG.task.type {kind!r} is not in the cluster ({', '.join(cluster)})")
    elif not isinstance(index, int) or isinstance(index, bool):
        errors.append(f"TF_CONFIG.task.index {index!r} is not an integer")
    elif not 0 <= index < len(cluster[kind]):
        errors.append(
            f"TF_CONFIG.task.index {index} is out of range for {kind} "
            f"({len(cluster[kind])} task(s))"
        )
    return errors


def check_batchai(
    cluster: dict[str, list[str]] | None,
    task: dict[str, Any] | None,
    worker_hosts: list[str] | None,
    ps_hosts: list[str] | None,
    job_name: str | None,
    task_index: int | None,
) -> list[str]:
    """Batch AI's view: workers include the master (worker 0, TF's chief), then the ps."""
    errors: list[str] = []
    if cluster is not None:
        tf_workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
        for name, listed, count, kinds in (
            ("AZ_BATCHAI_WORKER_HOSTS", worker_hosts, tf_workers, "chief+worker"),
            ("AZ_BATCHAI_PS_HOSTS", ps_hosts, len(cluster.get("ps", [])), "ps"),
        ):
            if listed is not None and len(listed) != count:
                errors.append(
                    f"{name} has {len(listed)} hosts, TF_CONFIG has {count} {kinds} tasks"
                )
    if job_name is not None:
        role_hosts = {"master": worker_hosts, "worker": worker_hosts, "ps": ps_hosts}
        if job_name not in role_hosts:
            errors.append(f"--job_name {job_name!r} is not one of master, worker, ps")
        elif task_index is None:
            errors.append("--job_name given without --task_index")
        else:
            members = role_hosts[job_name]
            if members is not None and not 0 <= task_index < len(members):
                errors.append(
                    f"--task_index {task_index} is out of range for {job_name} "
                    f"({len(members)} host(s))"
                )
            if cluster is not None and task is not None:
                expected = tf_task(job_name, task_index, has_chief="chief" in cluster)
                actual = (task.get("type"), task.get("index"))
                if expected != actual:
                    errors.append(
                        f"--job_name {job_name} --task_index {task_index} is TF task "
                        f"{expected[0]} {expected[1]}, but TF_CONFIG.task is "
                        f"{actual[0]} {actual[1]}"
                    )
    return errors


def tf_task(job_name: str, task_index: int, has_chief: bool) -> tuple[str, int]:
    """The TF_CONFIG task a Batch AI (job name, task index) is: worker 0 is the chief."""
    if job_name == "ps":
        return "ps", task_index
    if has_chief:
        return ("chief", 0) if task_index == 0 else ("worker", task_index - 1)
    return "worker", task_index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job_name", help="Batch AI recipe style: master, worker or ps")
    parser.add_argument("--task_index", type=int, help="index within --job_name's hosts")
    parser.add_argument("--ps_hosts", help="default: $AZ_BATCHAI_PS_HOSTS")
    parser.add_argument("--worker_hosts", help="default: $AZ_BATCHAI_WORKER_HOSTS")
    parser.add_argument("--rendezvous", metavar="DIR", type=Path,
                        help="write DIR/rank-<RANK>.json with what this task saw (for tests)")
    args = parser.parse_args(argv)

    rank = os.environ.get("RANK", str(os.getpid()))
    tag = f"[rank {rank}]"
    raw = os.environ.get("TF_CONFIG")
    errors: list[str] = []
    tf_config: Any = None
    if raw is None:
        errors.append("TF_CONFIG is not set")
    else:
        try:
            tf_config = json.loads(raw)
        except json.JSONDecodeError as exc:
            errors.append(f"TF_CONFIG is not JSON: {exc}")
    if tf_config is not None:
        errors += check_tf_config(tf_config)
    cluster = tf_config.get("cluster") if isinstance(tf_config, dict) else None
    task = tf_config.get("task") if isinstance(tf_config, dict) else None
    worker_hosts = hosts(args.worker_hosts or os.environ.get("AZ_BATCHAI_WORKER_HOSTS"))
    ps_hosts = hosts(args.ps_hosts or os.environ.get("AZ_BATCHAI_PS_HOSTS"))
    if worker_hosts is None:
        errors.append("AZ_BATCHAI_WORKER_HOSTS is not set")
    errors += check_batchai(
        cluster if isinstance(cluster, dict) else None,
        task if isinstance(task, dict) else None,
        worker_hosts, ps_hosts, args.job_name, args.task_index,
    )

    if isinstance(task, dict):
        print(f"{tag} task: {task.get('type')} {task.get('index')} on {socket.gethostname()}",
              flush=True)
    if isinstance(cluster, dict):
        for kind, members in cluster.items():
            print(f"{tag} cluster.{kind}: {members}", flush=True)
    print(f"{tag} AZ_BATCHAI_WORKER_HOSTS={os.environ.get('AZ_BATCHAI_WORKER_HOSTS')} "
          f"AZ_BATCHAI_PS_HOSTS={os.environ.get('AZ_BATCHAI_PS_HOSTS')} "
          f"AZ_BATCHAI_TASK_INDEX={os.environ.get('AZ_BATCHAI_TASK_INDEX')}", flush=True)
    if args.job_name is not None:
        print(f"{tag} command line: --job_name {args.job_name} --task_index {args.task_index}",
              flush=True)

    if args.rendezvous is not None:
        args.rendezvous.mkdir(parents=True, exist_ok=True)
        path = args.rendezvous / f"rank-{rank}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({
            "rank": rank, "started_at": STARTED_AT, "tf_config": tf_config,
            "worker_hosts": worker_hosts, "ps_hosts": ps_hosts, "job_name": args.job_name,
            "task_index": args.task_index, "ok": not errors, "errors": errors,
        }, indent=2) + "\n")
        os.replace(tmp, path)

    if errors:
        print(f"{tag} show_tf_config: inconsistent TensorFlow cluster:", file=sys.stderr)
        for error in errors:
            print(f"{tag}   - {error}", file=sys.stderr)
        return 1
    print(f"{tag} TF_CONFIG OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
