"""azureml.train.hyperdrive on batchyard: HyperDriveConfig, the samplings, the
early-termination policies, PrimaryMetricGoal and the parameter expressions. A submitted
HyperDriveConfig is a batchyard sweep (``batchyard sweep show``), each child run a job."""

from __future__ import annotations

from batchyard.compat.azureml.train.hyperdrive.parameter_expressions import (
    choice,
    lognormal,
    loguniform,
    normal,
    qlognormal,
    qloguniform,
    qnormal,
    quniform,
    randint,
    uniform,
)
from batchyard.compat.azureml.train.hyperdrive.policy import (
    BanditPolicy,
    EarlyTerminationPolicy,
    MedianStoppingPolicy,
    NoTerminationPolicy,
    TruncationSelectionPolicy,
)
from batchyard.compat.azureml.train.hyperdrive.run import HyperDriveRun
from batchyard.compat.azureml.train.hyperdrive.runconfig import (
    HyperDriveConfig,
    HyperDriveRunConfig,
    PrimaryMetricGoal,
)
from batchyard.compat.azureml.train.hyperdrive.sampling import (
    BayesianParameterSampling,
    GridParameterSampling,
    HyperParameterSampling,
    RandomParameterSampling,
)

__all__ = [
    "BanditPolicy", "BayesianParameterSampling", "EarlyTerminationPolicy",
    "GridParameterSampling", "HyperDriveConfig", "HyperDriveRun", "HyperDriveRunConfig",
    "HyperParameterSampling", "MedianStoppingPolicy", "NoTerminationPolicy",
    "PrimaryMetricGoal", "RandomParameterSampling", "TruncationSelectionPolicy", "choice",
    "lognormal", "loguniform", "normal", "qlognormal", "qloguniform", "qnormal", "quniform",
    "randint", "uniform",
]
