"""``GET /metrics``: Prometheus's exposition format, written by prometheus-client (content
negotiation included: OpenMetrics for a scraper that asks for it). Behind the scrape token
(server/scrape_auth.py). Concurrent scrapes within a second share one answer."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from batchyard.server.auth import server_context
from batchyard.server.scrape_auth import require_scrape

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_scrape)])
REUSE = 1.0  # seconds a rendered answer is served again
_lock = threading.Lock()
_last: dict[tuple[int, str], tuple[float, bytes, str]] = {}


@router.get("/metrics")
def metrics(request: Request) -> Response:
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    key = (id(server_context(request)), content_type)
    with _lock:  # one scrape renders at a time; those arriving meanwhile get its answer
        cached = _last.get(key)
        if cached is None or time.monotonic() - cached[0] > REUSE:
            body = encoder(_registry(request))
            cached = (time.monotonic(), body, content_type)
            _last[key] = cached
    return Response(cached[1], media_type=cached[2],
                    headers={"Cache-Control": "no-store"})


_registries: dict[int, CollectorRegistry] = {}


def _registry(request: Request) -> CollectorRegistry:
    ctx = server_context(request)
    found = _registries.get(id(ctx))
    if found is None:
        from batchyard.server.telemetry import instruments
        from batchyard.server.telemetry.collector import ClusterCollector

        found = _registries[id(ctx)] = instruments.scrape_registry(
            [ClusterCollector(ctx.db)])
    return found
