"""Listening ports that several replica processes share (``--workers N``): ``SO_REUSEPORT``.

Every replica binds its own listening socket to the same address and port with ``SO_REUSEPORT``,
after the fork; the kernel then spreads new connections over them (Linux ``socket(7)``,
``SO_REUSEPORT``). The supervisor first ``reserve``s each port: it makes sure no other server
listens there, resolves port 0 to a free port, and holds a bound socket that never listens, so the
port stays this server's while replicas come and go. Only processes of the same user can join a
port bound with ``SO_REUSEPORT``.
"""

from __future__ import annotations

import socket


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[object, ...]]:
    """The family and socket address of ``host`` (a name, an IPv4 or an IPv6 address, brackets
    allowed) for listening."""
    family, _, _, _, address = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    return family, address


def shared_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` (not yet listening).

    Raises:
        OSError: the port is taken by a socket without ``SO_REUSEPORT`` or of another user.
    """
    family, address = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def reserve(host: str, port: int) -> socket.socket:
    """Hold ``host:port`` for the replicas (``port`` 0: a free one; read it with ``getsockname``).

    Raises:
        OSError: another socket listens on the port (EADDRINUSE), even one with ``SO_REUSEPORT``
            that the replicas would otherwise share it with; or the address cannot be bound.
    """
    if port:
        family, address = _address(host, port)
        with socket.socket(family, socket.SOCK_STREAM) as probe:  # fails while anything listens there
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    return shared_socket(host, port)
