"""This node's network facts, found on the node itself (standard library only): the
interface that carries its address, for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME / Open MPI's
if_include (a hostname resolving to 127.0.1.1, Debian's default, otherwise sends gloo to
loopback), and ports free here."""

from __future__ import annotations

import fcntl
import random
import socket
import struct

SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B



PORT_RANGE = (20000, 32000)  # below net.ipv4.ip_local_port_range's default 32768

def _ipv4_of(name: str, request: int = SIOCGIFADDR) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), request,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def subnet_of(ifname: str) -> str | None:
    """``a.b.c.d/len`` of the interface's network: Open MPI takes it where interface names
    differ between machines."""
    addr, mask = _ipv4_of(ifname), _ipv4_of(ifname, SIOCGIFNETMASK)
    if addr is None or mask is None:
        return None
    bits = int.from_bytes(socket.inet_aton(mask), "big")
    net = int.from_bytes(socket.inet_aton(addr), "big") & bits
    return f"{socket.inet_ntoa(net.to_bytes(4, 'big'))}/{bin(bits).count('1')}"


def interface_of(address: str) -> str | None:
    """The name of the interface holding ``address`` (``lo`` for loopback), or None."""
    if address.startswith("127.") or address in ("::1", "localhost"):
        return "lo"
    try:
        wanted = socket.gethostbyname(address)
    except OSError:
        return None
    for _index, name in socket.if_nameindex():
        if _ipv4_of(name) == wanted:
            return name
    return None


def free_ports(count: int) -> list[int]:
    """Ports free on every address of this node right now (bound together, so distinct).

    Random picks in a range below Linux's ephemeral one, not ``bind(0)``: virtual nodes on
    one machine choose at the same moment, and the kernel hands the port one just closed
    to the next asker (two TF tasks got the same port here)."""
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            try:
                port = rng.randrange(PORT_RANGE[0], PORT_RANGE[1])
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports
