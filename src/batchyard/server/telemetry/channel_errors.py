"""Counts the node channel's refusals and failures (``batchyard_node_channel_errors_total``):
every answer of status 400 or more to a launcher's or an agent's call, by call and status.
Plain ASGI, so streamed answers pass through untouched, and a path outside the channel
costs one prefix test."""

from __future__ import annotations

from typing import Any

NODE = "/api/v1/node/attempts/"
AGENT = "/api/v1/agent/"
_ALIASES = {"sessions": "exec"}


def call_of(path: str) -> str:
    """The channel call a path names: ``/api/v1/node/attempts/U/nodes/0/logs`` -> logs,
    ``/api/v1/agent/nodes/box/heartbeat`` -> heartbeat, ``/api/v1/agent/join`` -> join."""
    parts = path.split("/")
    if path.startswith(NODE):
        name = parts[8] if len(parts) > 8 else ""
    else:
        name = parts[6] if len(parts) > 6 and parts[4] == "nodes" else parts[4]
    return _ALIASES.get(name, name)


class ChannelErrors:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith((NODE, AGENT)):
            await self.app(scope, receive, send)
            return

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                from batchyard.server.telemetry import instruments

                instruments.count_channel_error(call_of(scope["path"]), message["status"])
            await send(message)

        await self.app(scope, receive, watch)
