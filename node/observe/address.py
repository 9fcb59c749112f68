"""The observe listener's address: "host:port" (IPv6 as "[::1]:port"), parsed with a clear error.
Standard library only: the config validates it before anything heavy loads."""
from __future__ import annotations

import ipaddress

EXAMPLES = "e.g. 127.0.0.1:0 (a free loopback port), 127.0.0.1:9100, [::1]:9100, or an empty string for off"


def parse_listen(value: str) -> tuple[str, int] | None:
    """"127.0.0.1:9100" -> ("127.0.0.1", 9100); "" -> None (off). Raises ValueError naming the problem."""
    value = value.strip()
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r} is not HOST:PORT ({EXAMPLES})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{value!r}: host {host!r} is not an IP address ({EXAMPLES})") from None
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r}: port {port!r} is not a number from 0 to 65535 (0 picks a free one)")
    return str(ip), int(port)


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def url_host(host: str) -> str:
    """The host as it goes into a URL (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host
