"""azureml.data: data references to datastore paths."""
