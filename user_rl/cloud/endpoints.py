"""The address a learner tells others: a socket bound to every interface (`learner.host: 0.0.0.0`)
is reached at this machine's address, never at 0.0.0.0, which a robot's controller would take for
itself."""

from __future__ import annotations

import socket

WILDCARDS = ("0.0.0.0", "*", "::", "[::]")


def this_machine_address() -> str:
    """The IP address other machines reach this one at: that of the interface the default route
    leaves by (a UDP socket's connect sends nothing); loopback where there is no route."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.254.254.254", 1))
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def reachable_endpoint(endpoint: str) -> str:
    """`tcp://0.0.0.0:5555` -> `tcp://<this machine's address>:5555`; any other endpoint as it is."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if sep and colon and host in WILDCARDS:
        return f"{scheme}://{this_machine_address()}:{port}"
    return endpoint
