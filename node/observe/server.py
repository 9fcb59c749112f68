"""The observe listener: a read-only HTTP server (GET only) on its own daemon threads, so a slow or
stuck client never holds up the round loop; `stop` ends it with the node.

Bound to loopback by default. A loopback listener also refuses requests whose Host header is not
an IP address or localhost: a web page the operator visits cannot rebind its own domain name to
127.0.0.1 and read the node's state (DNS rebinding)."""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from node.observe.address import is_loopback, parse_listen, url_host

log = logging.getLogger(__name__)

# path -> () -> (body, content type), evaluated per request
Routes = dict[str, Callable[[], tuple[bytes, str]]]


def _local_host_header(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _handler(routes: Routes, loopback: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "swarm-node-observe"
        sys_version = ""

        def do_GET(self):  # noqa: N802 (http.server's name)
            if loopback and not _local_host_header(self.headers.get("Host", "")):
                return self._send(403, b"forbidden: use http://127.0.0.1:PORT/\n", "text/plain; charset=utf-8")
            route = routes.get(urlsplit(self.path).path)
            if route is None:
                return self._send(404, b"not found\n", "text/plain; charset=utf-8")
            try:
                body, content_type = route()
            except Exception:  # our bug: the listener stays up and says so
                log.exception("observe: %s failed", self.path)
                return self._send(500, b"internal error (see the node's log)\n", "text/plain; charset=utf-8")
            self._send(200, body, content_type)

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # scrapes every few seconds: not on the node's console
            log.debug("observe: " + fmt, *args)

    return Handler


class ObserveServer:
    def __init__(self, address: str, routes: Routes):
        parsed = parse_listen(address)
        if parsed is None:
            raise ValueError("the observe listener is off (empty address): do not start it")
        host, port = parsed
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        try:
            self.httpd = server_class((host, port), _handler(routes, is_loopback(host)))
        except OSError as err:
            raise OSError(f"cannot listen on {address} for metrics and the page ({err.strerror}): is the port "
                          "in use? (swarm.metrics_listen=127.0.0.1:0 picks a free one; an empty value turns "
                          "it off)") from None
        self.host, self.port = host, self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                       name="observe-http", daemon=True)

    @property
    def address(self) -> str:
        return f"{url_host(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/"

    def start(self) -> "ObserveServer":
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()  # returns once serve_forever has seen it (poll_interval)
            self.thread.join(timeout_s)
        self.httpd.server_close()
