"""Service functions: the logic behind the routers. Each takes a session and plain values,
raises errors from batchyard.errors, and never knows about HTTP."""
