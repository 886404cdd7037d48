"""Every state a job, an attempt, a node and a node launcher can be in, and the groups the
code asks about, in one place (standard library only: the launcher imports it under -S).
Members are ``str``s, so they compare equal to what the database and the API carry."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    FINALIZING = "finalizing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class AttemptState(StrEnum):
    LAUNCHING = "launching"
    PREPARING = "preparing"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    PREEMPTED = "preempted"


class NodeState(StrEnum):
    PREPARING = "preparing"
    IDLE = "idle"
    RUNNING = "running"
    LEAVING = "leaving"
    UNUSABLE = "unusable"
    PREEMPTED = "preempted"
    LOST = "lost"  # a machine whose agent stopped heartbeating


class LauncherState(StrEnum):
    """What a node launcher reports for its share of an attempt (and ``lost`` when the
    server or its agent knows it is gone without a last word)."""

    STARTING = "starting"
    PREPARING = "preparing"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    TIMEOUT = "timeout"
    ABORTED = "aborted"
    PREEMPTED = "preempted"
    LOST = "lost"


JOB_ACTIVE = (JobState.QUEUED, JobState.PREPARING, JobState.RUNNING, JobState.FINALIZING)
JOB_TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELED)
JOB_STATES = tuple(JobState)
ATTEMPT_ACTIVE = (AttemptState.LAUNCHING, AttemptState.PREPARING, AttemptState.RUNNING,
                  AttemptState.STOPPING)
ATTEMPT_ENDED = (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELED,
                 AttemptState.PREEMPTED)
NODE_STATES = tuple(NodeState)
NODE_GONE = (NodeState.LEAVING, NodeState.PREEMPTED)
LAUNCHER_FINAL = (LauncherState.SUCCEEDED, LauncherState.FAILED, LauncherState.CANCELED,
                  LauncherState.TIMEOUT, LauncherState.ABORTED, LauncherState.PREEMPTED)
LAUNCHER_TERMINAL = (*LAUNCHER_FINAL, LauncherState.LOST)
