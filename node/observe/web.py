"""The routes of the observe listener: the page and its script (files next to this module, no CDN:
nodes are often offline), /api/state (JSON the page polls) and /metrics (Prometheus)."""
from __future__ import annotations

import json
import logging
import math
from importlib import resources
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from node.observe.logs import say
from node.observe.address import is_loopback, parse_listen
from node.observe.prometheus import node_registry
from node.observe.server import ObserveServer, Routes
from node.observe.state import NodeObserver

log = logging.getLogger(__name__)
HTML = "text/html; charset=utf-8"


def static(name: str) -> bytes:
    return resources.files("node.observe").joinpath(name).read_bytes()


def finite(value):
    """JSON has no NaN or infinity (a browser's JSON.parse refuses them): they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_route(state: Callable[[], dict]) -> Callable[[], tuple[bytes, str]]:
    return lambda: (json.dumps(finite(state()), default=str).encode(), "application/json")


def page_routes(state: Callable[[], dict]) -> Routes:
    page, script = static("page.html"), static("page.js")
    return {"/": lambda: (page, HTML), "/page.js": lambda: (script, "text/javascript; charset=utf-8"),
            "/api/state": json_route(state)}


def node_routes(state: Callable[[], dict], registry: CollectorRegistry) -> Routes:
    return {**page_routes(state), "/metrics": lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)}


def serve_node(address: str, observer: NodeObserver) -> ObserveServer | None:
    """The node's listener on `address` (swarm.metrics_listen), started; None when that is empty (off)."""
    if parse_listen(address) is None:
        return None
    return ObserveServer(address, node_routes(observer.state, node_registry(observer))).start()


def announce(server: ObserveServer | None, console, what: str) -> None:
    if server is None:
        return
    say(console, f"{what} on {server.url}", "observe_listen", url=server.url)
    if not is_loopback(server.host):
        log.warning("%s is not a loopback address: anyone who can reach it sees this node's peers, scores and "
                    "curves (nothing secret, but firewall it)", server.address,
                    extra={"event": "observe_exposed", "address": server.address})
