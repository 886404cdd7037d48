# Seed 001 (Azure ML Compute: Horovod PyTorch MNIST) on batchyard: the notebook's code cells in
# order, with only the imports changed (azureml.X -> batchyard.compat.azureml.X). Values the
# article leaves as <placeholders> are filled in; `!wget` is replaced by the copy of the
# training script kept next to this file. Run it from this directory:
#     python seed001.py
# It starts a local batchyard server when none runs, creates the workspace, a 2-node cluster
# and the experiment, trains on 2 nodes with MPI and streams every rank's log. As in Azure ML,
# Workspace.create fails when the workspace exists: run it again with a fresh BATCHYARD_HOME
# (or delete the workspace first).
# ruff: noqa: E402, I001  (notebook cells: imports where the cells have them)

# ① SDK version
from batchyard.compat import azureml
print("SDK version:", azureml.core.VERSION)

from batchyard.compat.azureml.telemetry import set_diagnostics_collection
set_diagnostics_collection(send_diagnostics=True)

# ② workspace
from batchyard.compat.azureml.core.workspace import Workspace
ws = Workspace.create(name='seed-workspace',
                      subscription_id='00000000-0000-0000-0000-000000000000',
                      resource_group='seed-resource-group',
                      create_resource_group=True,
                      location='eastus'
                     )

ws.write_config()

# the second time: either of these
from batchyard.compat.azureml.core.workspace import Workspace
ws = Workspace.get(name='seed-workspace',
                      subscription_id='00000000-0000-0000-0000-000000000000',
                      resource_group='seed-resource-group'
                     )

ws = Workspace.from_config()

# ③ AML Compute cluster
from batchyard.compat.azureml.core.compute import ComputeTarget, AmlCompute
from batchyard.compat.azureml.core.compute_target import ComputeTargetException

# choose a name for your cluster
cluster_name = "gpucluster"

try:
    compute_target = ComputeTarget(workspace=ws, name=cluster_name)
    print('Found existing compute target.')
except ComputeTargetException:
    print('Creating a new compute target...')
    compute_config = AmlCompute.provisioning_configuration(vm_size='STANDARD_NC6',
                                                           vm_priority="lowpriority",
                                                           max_nodes=2)

    # create the cluster
    compute_target = ComputeTarget.create(ws, cluster_name, compute_config)

    compute_target.wait_for_completion(show_output=True)

# Use the 'status' property to get a detailed status for the current AmlCompute.
print(compute_target.status.serialize())

# ④ the training script
import os
project_folder = './pytorch-distr-hvd'
os.makedirs(project_folder, exist_ok=True)

import shutil

# !wget "https://github.com/Azure/MachineLearningNotebooks/.../pytorch_horovod_mnist.py"
shutil.copy('pytorch_horovod_mnist.py', project_folder)

# ⑤ experiment
from batchyard.compat.azureml.core import Experiment
experiment_name = 'pytorch-distr-hvd'
experiment = Experiment(ws, name=experiment_name)

# ⑥ estimator (use_gpu=True in the seed; this example runs on CPUs)
from batchyard.compat.azureml.train.dnn import PyTorch
estimator = PyTorch(source_directory=project_folder,
                    compute_target=compute_target,
                    entry_script='pytorch_horovod_mnist.py',
                    node_count=2,
                    process_count_per_node=1,
                    distributed_backend='mpi',
                    use_gpu=False)

# ⑦ run
run = experiment.submit(estimator)
print(run)

from batchyard.compat.azureml.widgets import RunDetails
RunDetails(run).show()

run.wait_for_completion(show_output=True)
