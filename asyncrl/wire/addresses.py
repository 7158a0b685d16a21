"""Addresses: the host of an endpoint, whether only this host can reach it (``is_loopback``, the
rule that decides CURVE), an endpoint written as ``HOST:PORT`` made whole, the address other hosts
should use for a bound socket (``advertised``), and the broadcaster's snapshot endpoint beside its
PUB socket."""

from __future__ import annotations

import ipaddress
import socket


def endpoint_host(endpoint: str) -> str:
    """``tcp://HOST:PORT`` -> HOST (brackets of an IPv6 literal removed). Raises ValueError for an
    endpoint that is not ``tcp://HOST:PORT``, ``ipc://...`` or ``inproc://...``."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return ""
    if not endpoint.startswith("tcp://") or ":" not in endpoint[6:]:
        raise ValueError(f"expected tcp://HOST:PORT, got {endpoint!r}")
    host = endpoint[6:].rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(endpoint: str) -> bool:
    """True if only this host can reach ``endpoint``: 127.0.0.0/8, ::1, localhost, ipc://,
    inproc://. Wildcards (0.0.0.0, *, ::) and every other name or address are not loopback.
    Raises ValueError as ``endpoint_host``."""
    host = endpoint_host(endpoint)
    if endpoint.startswith(("ipc://", "inproc://")) or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name or "*": reachable from elsewhere
        return False


_WILDCARDS = ("0.0.0.0", "*", "::", "")


def normalize_endpoint(text: str) -> str:
    """``HOST:PORT`` or ``tcp://HOST:PORT`` -> ``tcp://HOST:PORT`` (ipc:// and inproc:// as they
    are). Raises ValueError for anything else, e.g. a missing port."""
    if text.startswith(("ipc://", "inproc://")):
        return text
    if "://" in text and not text.startswith("tcp://"):
        raise ValueError(f"expected HOST:PORT or tcp://HOST:PORT, got {text!r}")
    full = text if text.startswith("tcp://") else f"tcp://{text}"
    if ":" not in full[6:] or not (full.rsplit(":", 1)[1] == "*" or full.rsplit(":", 1)[1].isdigit()):
        raise ValueError(f"expected HOST:PORT or tcp://HOST:PORT, got {text!r}")
    port = full.rsplit(":", 1)[1]
    if port.isdigit() and int(port) > 65535:
        raise ValueError(f"port {port} in {text!r} is out of range (0-65535)")
    return full


def advertised(bound: str, advertise: str | None = None) -> str:
    """The address other hosts should use for a socket bound at ``bound`` (with its real port):
    ``advertise`` (HOST, HOST:PORT or tcp://HOST:PORT; the bound port when none is given), else
    the bound host, or, when bound to a wildcard such as 0.0.0.0, this host's name if it does not
    resolve to a loopback address, else its outbound IP address (:func:`wildcard_host`); never
    ``localhost``. Raises ValueError for an ``advertise`` that is not an address."""
    return advertised_with_source(bound, advertise)[0]


def advertised_with_source(bound: str, advertise: str | None = None) -> tuple[str, str]:
    """(:func:`advertised` address, where it came from: "--advertise", "the bound address",
    "this host's name ..." or "this host's outbound address ...") for the start-up lines."""
    port = bound.rsplit(":", 1)[1]
    if advertise:
        if advertise.startswith("tcp://") or advertise.rsplit(":", 1)[-1].isdigit() and ":" in advertise:
            return normalize_endpoint(advertise), "--advertise"
        return normalize_endpoint(f"{advertise}:{port}"), "--advertise"
    host = endpoint_host(bound)
    if host not in _WILDCARDS:
        return f"tcp://{host}:{port}", "the bound address"
    host, source = wildcard_host()
    return f"tcp://{host}:{port}", source


def _resolves_to_loopback(name: str) -> bool:
    try:
        infos = socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError):
        return True  # unresolvable: no use to other hosts either
    return all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def outbound_address() -> str | None:
    """This host's IP address on the interface of its default route (a UDP socket is connected
    to a documentation address; no packet is sent), or None without a route."""
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                addr = s.getsockname()[0]
        except OSError:
            continue
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    return None


def wildcard_host() -> tuple[str, str]:
    """The host other machines should use for a socket bound to a wildcard, and where it came
    from: this host's name when it resolves to a non-loopback address (many machines map their
    name to 127.0.1.1 or call themselves localhost), else the outbound IP address, else the name
    with a warning to give --advertise."""
    for name in dict.fromkeys((socket.getfqdn(), socket.gethostname())):
        if name and name != "localhost" and not _resolves_to_loopback(name):
            return name, f"this host's name {name}; --advertise to choose another"
    addr = outbound_address()
    if addr is not None:
        return addr, (
            f"this host's outbound address {addr} (its name resolves only to loopback); --advertise to choose another"
        )
    name = socket.gethostname()
    return name, (
        f"this host's name {name}, which other hosts may not resolve: no non-loopback address "
        "was found; give --advertise"
    )


def snapshot_endpoint(broadcaster: str) -> str:
    """The broadcaster's request socket: one port above its PUB socket (tcp://HOST:PORT), or
    beside it (ipc://PATH -> ipc://PATH.snapshot)."""
    if broadcaster.startswith("ipc://"):
        return f"{broadcaster}.snapshot"
    host, port = broadcaster.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"
