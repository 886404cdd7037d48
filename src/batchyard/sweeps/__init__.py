"""Hyperparameter sweeps, the pure part: search spaces and sampling (on Optuna's samplers),
early-termination policies, and substituting sampled values into a trial's job. No I/O: the
server's sweep driver (``server.sweep_driver``) feeds these with what the store holds, so a
restarted server makes the same decisions."""
