"""The part of MLflow's tracking REST API that training scripts use, so that unchanged
``mlflow`` calls in a job (``log_metric``, ``log_param``, ``set_tag``, ``log_artifact``,
``autolog()``) land on the job itself: a batchyard job is an MLflow run, its experiment the
MLflow experiment; metrics become the job's metrics, params and tags the job's, artifacts
files of its outputs. Ranks reach it with their job token (``MLFLOW_TRACKING_TOKEN``), which
acts for its own job's run only."""
