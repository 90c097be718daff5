"""Worker URLs from a host and a port: the one place they are built (pod IPs, bind addresses)."""

from __future__ import annotations


def http_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` for a host name, an IPv4 address or an IPv6 address.

    An IPv6 address goes in brackets (``http://[fd00::1]:8000``, RFC 3986: without them the port
    cannot be told from the address); one already in brackets is kept as it is. IPv6-only and
    dual-stack clusters give pods IPv6 addresses."""
    host = host.strip()
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"
