"""The address a client is counted as, by the connection cap and the body budget alike."""

from __future__ import annotations

import ipaddress


def client_of(address: str) -> str:
    """What the cap counts an address as: itself, an IPv4-mapped IPv6 one as its IPv4 address.
    (Not an IPv6 one's /64: every host of an IPv6 network shares one, and a cluster's nodes would
    share one cap. A client holding a /64 can take a new address for each connection: the cap
    bounds one misbehaving client, not a distributed attack.)"""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])  # without a scope ("fe80::1%eth0")
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)
