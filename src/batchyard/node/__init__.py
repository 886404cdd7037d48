"""The node launcher: one per node per attempt, detached from the server.

Imports only the standard library so that it starts in tens of milliseconds.
"""
