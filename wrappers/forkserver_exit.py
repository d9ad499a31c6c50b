"""Imported by a fork server alone (eval's, a vector env's: their preload): at its exit, its socket and the
``pymp-*`` directory that held it go too.

The parent that started the server removes that directory at its own exit, but a parent that was
SIGKILLed or OOM-killed never does: each such run left ``/tmp/pymp-*/listener-*`` behind. The
server outlives it (it ends when its last client, the parent or a worker, is gone), and the socket
is no one's then (a parent that lives on starts a new server, at a new address, when it finds
this one dead)."""

import atexit
import contextlib
import os
from pathlib import Path


def _remove_socket(server_pid: int) -> None:
    if os.getpid() != server_pid:  # (a worker forked from the server inherits this hook: not its socket)
        return
    from multiprocess import forkserver

    address = forkserver._forkserver._forkserver_address
    if not isinstance(address, str) or not os.path.isabs(address):  # (none, or an abstract socket)
        return
    with contextlib.suppress(OSError):
        os.unlink(address)
    if Path(address).parent.name.startswith("pymp-"):
        with contextlib.suppress(OSError):  # (only when empty: what others made there stays)
            os.rmdir(Path(address).parent)


atexit.register(_remove_socket, os.getpid())
