"""Which network interface carries an address, and what the collectives then need to be told (Linux, no torch).

gloo and NCCL pick the address to advertise from this host's name; when that name resolves to a
loopback address (containers, network namespaces, many cloud images: ``127.0.0.1 myhost`` in
/etc/hosts), they bootstrap on 127.0.0.1 and peers on other hosts cannot reach them. When the
rendezvous connection shows a real address, its interface is what they should use.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping

_SIOCGIFADDR = 0x8915
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(address: str) -> str | None:
    """The name of the interface holding IPv4 ``address``, or None."""
    for _, name in socket.if_nameindex():
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("256s", name.encode()[:15])
            if socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)[20:24]) == address:
                return name
    return None


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def collective_interface(base_env: Mapping[str, str], rendezvous_address: str, hostname_address: str,
                         interface: str | None) -> dict[str, str]:
    """The ``*_SOCKET_IFNAME`` variables to give the workers (pure): only when this host's name resolves to
    loopback while the rendezvous runs over a real address, and never over a value the user set."""
    if any(v in base_env for v in IFNAME_VARIABLES) or interface is None:
        return {}
    if not is_loopback(hostname_address) or is_loopback(rendezvous_address):
        return {}
    return dict.fromkeys(IFNAME_VARIABLES, interface)
