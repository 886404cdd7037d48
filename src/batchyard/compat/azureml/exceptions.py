"""azureml.exceptions: the exception types code written for azureml catches."""

from __future__ import annotations

from typing import Any


class AzureMLException(Exception):
    def __init__(self, exception_message: str = "", inner_exception: BaseException | None = None,
                 **kwargs: Any) -> None:
        super().__init__(exception_message)
        self.message = exception_message
        self.inner_exception = inner_exception

    def __str__(self) -> str:
        return self.message


class UserErrorException(AzureMLException):
    """The caller asked for something wrong or impossible."""


class WorkspaceException(UserErrorException):
    pass


class AuthenticationException(UserErrorException):
    """Signing in failed (a token refused, a service principal that is not who it says)."""


class ProjectSystemException(WorkspaceException):
    pass


class ComputeTargetException(AzureMLException):
    pass


class ExperimentExecutionException(AzureMLException):
    pass


class ActivityFailedException(AzureMLException):
    """Raised by ``Run.wait_for_completion`` when the run failed."""

    def __init__(self, error_details: Any = None, exception_message: str = "",
                 **kwargs: Any) -> None:
        super().__init__(exception_message or f"Activity Failed:\n{error_details}", **kwargs)
        self.error_details = error_details


class RunEnvironmentException(AzureMLException):
    """``Run.get_context(allow_offline=False)`` outside a run."""


class TrainingException(UserErrorException):
    """An estimator or run configuration that cannot be turned into a job."""


class UnsupportedParameterError(UserErrorException):
    """A parameter batchyard cannot honour here; ``parameters`` names it (them)."""

    def __init__(self, parameters: list[str] | str, reason: str, where: str = "") -> None:
        names = [parameters] if isinstance(parameters, str) else list(parameters)
        self.parameters = names
        place = f"{where}: " if where else ""
        super().__init__(f"{place}{', '.join(names)} cannot be honoured by batchyard: {reason}")


__all__ = ["ActivityFailedException", "AzureMLException", "ComputeTargetException",
           "ExperimentExecutionException", "ProjectSystemException", "RunEnvironmentException",
           "TrainingException", "UnsupportedParameterError", "UserErrorException",
           "WorkspaceException"]
