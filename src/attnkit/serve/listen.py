"""Where `attnkit serve` listens: the port and the host checked, and the socket bound, before the run loads.

Binding first means that a busy port, a host that is no address of this machine, or a port that needs privileges
is said in one line with its fix before any time goes into loading weights; and `--port 0` (any free port) can
report the port the system chose, since the socket is ours to ask.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from attnkit.errors import InputError

MAX_PORT = 65535  # TCP ports are 16 bits


def check_port(port: object) -> None:
    """InputError for a port that is no TCP port (0 asks the system for any free one)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise InputError(f"--port {port} is no TCP port: give one from 1 to {MAX_PORT}, or 0 for any free port")


def addresses(host: str) -> list[tuple]:
    """getaddrinfo's answers for listening on `host`; InputError for a host that is neither an address nor a name
    this machine resolves."""
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        raise InputError(f"--host {host!r} is neither an IP address nor a name this machine resolves: give one of "
                         "its addresses (127.0.0.1, the default; 0.0.0.0 for every interface)") from None


def is_local(host: str) -> bool:
    """Whether every address `host` stands for is this machine's loopback (127.0.0.0/8, ::1)."""
    return all(ipaddress.ip_address(sockaddr[0].split("%")[0]).is_loopback
               for *_, sockaddr in addresses(host))


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening; InputError naming the cause and the fix when the
    port is busy, the host no address of this machine, or the port needs privileges."""
    check_port(port)
    family, kind, proto, _, sockaddr = addresses(host)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait for TIME_WAIT
    try:
        sock.bind((sockaddr[0], port, *sockaddr[2:]))
        sock.listen(2048)  # as uvicorn; connections made while the run loads wait in the backlog
    except OSError as error:
        sock.close()
        raise InputError(_bind_refusal(error, host, port)) from None
    return sock


def _bind_refusal(error: OSError, host: str, port: int) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use (another server is listening there): stop it, or choose another "
                "--port (--port 0 takes any free one)")
    if error.errno == errno.EADDRNOTAVAIL:
        return (f"--host {host} is not an address of this machine: give one of its addresses (127.0.0.1, the "
                "default; 0.0.0.0 for every interface)")
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"port {port} needs privileges on this machine: choose --port 1024 or above (or 0 for any free one)"
    return f"cannot listen on {host} port {port}: {error.strerror or error}"


def url(sock: socket.socket) -> str:
    """http://host:port/ of a bound socket, with the port the system chose for port 0."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
