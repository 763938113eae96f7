"""Which bind addresses are loopback: the one network rule the config, the loader and the servers share.

What it is: ``is_loopback_host``, used to refuse a non-loopback bind without an API key (the loader, the
CPU server, the vLLM launcher). What it is not: name resolution; a host name other than ``localhost``
is never loopback here, whatever it resolves to.
"""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """True for a bind address only this machine can reach: ``localhost``, ``127.0.0.0/8``, ``::1``.

    ``0.0.0.0`` / ``::`` (every interface) and any other address or name are not loopback.
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
