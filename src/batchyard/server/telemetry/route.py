"""``GET /metrics``: Prometheus's exposition format, written by prometheus-client (content
negotiation included: OpenMetrics for a scraper that asks for it). Behind the scrape token
(server/scrape_auth.py)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from batchyard.server.auth import server_context
from batchyard.server.scrape_auth import Scrape

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

router = APIRouter(include_in_schema=False, dependencies=[Depends(Scrape())])
CPU_HEADER = "X-Scrape-Cpu-Seconds"  # what rendering this answer cost (bench/metrics_scrape.py)
_lock = threading.Lock()
_registries: dict[int, CollectorRegistry] = {}


@router.get("/metrics")
def metrics(request: Request) -> Response:
    from prometheus_client.exposition import choose_encoder

    began = time.thread_time()  # this request's own CPU (the endpoint runs in one thread)
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encoder(_registry(request))
    return Response(body, media_type=content_type, headers={
        "Cache-Control": "no-store",
        CPU_HEADER: f"{time.thread_time() - began:.6f}"})


def _registry(request: Request) -> CollectorRegistry:
    ctx = server_context(request)
    with _lock:
        found = _registries.get(id(ctx))
        if found is None:
            from batchyard.server.telemetry import instruments
            from batchyard.server.telemetry.collector import ClusterCollector

            found = _registries[id(ctx)] = instruments.scrape_registry(
                [ClusterCollector(ctx.db)])
    return found
