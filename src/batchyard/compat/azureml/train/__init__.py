"""azureml.train: estimators (``train.estimator``) and framework estimators (``train.dnn``)."""
