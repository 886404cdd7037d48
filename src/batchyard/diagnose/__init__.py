"""`batchyard cluster diagnose`: the seed's Intel MPI PingPong, built in.

The probe (`python -m batchyard.diagnose`) runs as a job with one rank per node: a ping-pong
between every pair of nodes (latency of small messages, bandwidth of large ones) and an
allreduce over all nodes (bus bandwidth), over MPI when mpi4py is importable, otherwise over
torch.distributed (gloo on CPUs, nccl on GPUs)."""
