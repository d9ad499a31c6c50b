"""``RayVectorEnv``: the same vector env as ``SubprocVectorEnv``, with environment hosts as Ray actors.

When rollouts outgrow one machine, environments run on others through Ray: the LLM-RL trainers
(SkyRL, verl, OpenRLHF) already run on it, so hosts join the trainer's cluster (``address="auto"``,
or nothing when this process already called ``ray.init``) or one that ``benchmax-gym launch``
provisions with SkyPilot. Ray places the hosts, detects failures
and hands each host's address and key to the parent.

Each host is one Ray actor running the vector env's own worker loop over several environments;
the parent logic (lock-step and ready-first calls, autoreset, faults) is ``WorkerVectorEnv``'s,
shared with ``SubprocVectorEnv``. The messages go over one TCP connection per host (the worker
protocol of a local pipe; both ends prove they hold a random per-host key, every frame then
carries an HMAC from a key of that connection, and the host listens on its node's Ray address
only until the parent connects). Frames stay pickles, authenticated before they are unpickled:
what hosts send holds Gymnasium spaces and whatever an env puts in its infos, which no plain
format carries. A Ray actor call costs 1.2-1.6 ms a
round on a 2-core machine (plain, async, threaded and compiled-graph actors alike), more than a
whole local step of 64 environments. So the parent must reach the hosts' nodes on an ephemeral
port, as it reaches Ray's own worker ports; Ray Client (``ray://``) drivers outside the cluster
usually cannot.

Faults have the local semantics: a host whose actor or node dies, or that passes ``step_timeout``,
is killed and recreated wherever Ray has capacity (retrying with backoff until ``start_timeout``);
its environments report ``truncated=True`` with ``info["error"]``; the others go on. Each host keeps
its workspaces under a temp root of its own that it removes when it closes; when a host is killed
(Ray kills its child processes: sandboxes, MCP servers), a Ray task on its node removes the root.
``close()`` leaves no actor behind (and shuts Ray down if it was this env that started it).

    envs = RayVectorEnv("benchmax/Math-v0", 64, num_hosts=8, address="auto",
                        actor_options={"num_cpus": 1, "resources": {"benchmax_env_host": 1}})
    envs = gym.make_vec("benchmax/Math-v0", num_envs=64, vector_backend="ray", num_hosts=8)
"""

from __future__ import annotations

import functools
import hmac
import logging
import math
import os
import pickle
import selectors
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode
from multiprocess.connection import Connection

from benchmax_gym.core.sandbox import remove_tree

from .channel import WorkerLost, _Channel, readable
from .vector import WorkerVectorEnv, _env_fns, seconds_arg
from .worker import _worker_main, driver_registrations, use_temp_root, with_registrations

ENV_HOST_RESOURCE = "benchmax_env_host"  # the custom resource `benchmax-gym launch` gives each node
DEFAULT_ENVS_PER_HOST = 16
# Hosts spread over the nodes; one CPU each (a host is one process running one event loop).
DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
_OURS = ("name", "max_restarts", "lifetime", "max_concurrency")  # options this class sets itself
HOST_TEMP_PREFIX = "benchmax-host-"



def import_ray():
    """``ray``, or an ImportError that names the extra to install."""
    try:
        import ray
    except ImportError:
        raise ImportError("RayVectorEnv needs Ray: pip install 'benchmax-gym[ray]'") from None
    return ray


# -- the host (a Ray actor) ----------------------------------------------------------------------


class _Host:
    """A Ray actor hosting some environments: the vector env's worker loop, over a socket.

    Ray places the host, reports its death and hands over its address and key; the steps go over
    one authenticated TCP connection to the parent, as a local worker's go over its pipe (an
    actor call costs 1.2-1.6 ms a round on a small machine, more than a whole local step). The
    actor is threaded: ``serve`` holds one thread for the host's life, ``where`` answers on another.
    """

    def __init__(self, key: bytes) -> None:
        import ray

        _sweep_dead_hosts()
        self.key = key
        self.tmp = tempfile.mkdtemp(prefix=f"{HOST_TEMP_PREFIX}{os.getpid()}-")
        os.chmod(self.tmp, 0o711)  # a sandbox's unprivileged uid must reach its workspace inside
        self.ip = ray.util.get_node_ip_address()
        self.server = socket.create_server((self.ip, 0))
        self.node_id = ray.get_runtime_context().get_node_id()

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node_id": self.node_id, "ip": self.ip,
                "port": self.server.getsockname()[1], "workspace": self.tmp}

    def serve(self, payload: bytes, mode_value: str, fresh: bool, keep: tuple[str, ...] | None) -> None:
        """Take the parent's connection, then run the worker loop until it says close (or goes)."""
        import ray

        try:
            conn = _accept(self.server, self.key, ACCEPT_TIMEOUT)
        finally:
            self.server.close()
        try:
            use_temp_root(self.tmp)
            _worker_main(conn, functools.partial(_host_envs, payload), mode_value, fresh, keep,
                         origin=f"on node {self.ip}: ", by_value=ray.cloudpickle.dumps)
        finally:
            conn.close()
            _remove_workspace(self.tmp)
        if conn.rejected:  # the parent learns it from Ray (the connection can no longer say it)
            raise FrameRejected(f"env host on {self.ip}: {conn.rejected}")


def _host_envs(payload: bytes) -> dict[int, Callable[[], gym.Env]]:
    """A host's environment functions, once the driver's Python registrations
    (:func:`~.worker.driver_registrations`) are made here too (those the host's own imports made stay)."""
    registrations, env_fns = pickle.loads(payload)
    return with_registrations(registrations, env_fns)


LIVENESS_CHECK_S = 1.0  # how often a silent wait asks Ray whether its hosts are still alive
ACCEPT_TIMEOUT = 300.0  # a host nobody connects to within it gives up (its parent is gone)
HANDSHAKE_TIMEOUT = 10.0  # for one connection's whole handshake (not per byte)
LOST_REASON_WAIT_S = 2.0  # how long a lost host's error waits for Ray's word on its end (ActorDiedError...)
MAX_HANDSHAKES = 64  # connections a host handshakes at once; a new one beyond drops the oldest
TAG_BYTES = 32


class FrameRejected(RuntimeError):
    """A frame on an env host's connection failed authentication: tampered with, injected,
    replayed or dropped on the way. It was not unpickled; the connection is no longer trusted."""


def _proof(key: bytes, role: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, role + challenge, "sha256").digest()


def _session_keys(key: bytes, role: bytes, mine: bytes, theirs: bytes) -> tuple[bytes, bytes]:
    """(send, receive) frame keys for this connection: one per direction, from both challenges,
    so a frame of another connection or of the other direction never verifies here."""
    parent, host = (mine, theirs) if role == b"parent" else (theirs, mine)
    to_host, to_parent = (hmac.new(key, b"frames " + d + parent + host, "sha256").digest()
                          for d in (b"parent->host", b"host->parent"))
    return (to_host, to_parent) if role == b"parent" else (to_parent, to_host)


def _authenticate(sock: socket.socket, key: bytes, role: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> tuple[bytes, bytes]:
    """Both ends prove they hold ``key``: each answers the other's random challenge with an HMAC
    tagged with its role (so a challenge reflected back is no answer). Raises on a wrong peer;
    returns the connection's frame keys. (The parent's side; a host runs :class:`_Handshake`.)"""
    deadline = time.monotonic() + timeout
    mine = os.urandom(32)
    sock.sendall(mine)
    theirs = _read_exactly(sock, 32, deadline)
    other = b"host" if role == b"parent" else b"parent"
    sock.sendall(_proof(key, role, theirs))
    if not hmac.compare_digest(_read_exactly(sock, 32, deadline), _proof(key, other, mine)):
        raise ConnectionRefusedError("the peer does not hold this vector env's key")
    return _session_keys(key, role, mine, theirs)


def _read_exactly(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    data = b""
    while len(data) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the peer did not finish the handshake in time")
            sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the peer closed the connection")
        data += chunk
    return data


class _Handshake:
    """The host's side of one peer's handshake, advanced as its bytes arrive (never blocking), so
    a host handshakes with many peers at once and a slow one holds up no other."""

    def __init__(self, sock: socket.socket, address: tuple, key: bytes, deadline: float):
        self.sock, self.key, self.deadline = sock, key, deadline
        self.peer = "the parent at {}:{}".format(*address[:2])
        self.mine = os.urandom(32)
        self.got = b""
        self._send(self.mine)

    def _send(self, data: bytes) -> None:
        if self.sock.send(data) != len(data):  # (32 bytes into a fresh socket's buffer)
            raise ConnectionError("the peer's receive window is full")

    def advance(self) -> tuple[bytes, bytes] | None:
        """Read what arrived: the frame keys once the peer proved it holds the key, else None.
        Raises OSError for a peer to drop."""
        chunk = self.sock.recv(64 - len(self.got))  # no further: what follows is the parent's frames
        if not chunk:
            raise ConnectionResetError("the peer closed the connection")
        had, self.got = len(self.got), self.got + chunk
        if had < 32 <= len(self.got):
            self._send(_proof(self.key, b"host", self.got[:32]))
        if len(self.got) < 64:
            return None
        if not hmac.compare_digest(self.got[32:], _proof(self.key, b"parent", self.mine)):
            raise ConnectionRefusedError("the peer does not hold this vector env's key")
        return _session_keys(self.key, b"host", self.mine, self.got[:32])


class _Sealed:
    """An authenticated host connection: each frame (``multiprocessing``'s length-prefixed
    framing) ends with an HMAC-SHA256 tag over its sequence number, length and body, with this
    connection's key for its direction. A frame tampered with, injected, replayed, reordered or
    dropped on the way fails the check before it is unpickled, and so does everything after it:
    the receiving end raises ``error`` (the parent: :class:`FrameRejected`; a host: an OSError,
    which ends its worker loop, and ``serve`` reports ``rejected`` through Ray)."""

    def __init__(self, conn: Connection, keys: tuple[bytes, bytes], peer: str, error: type[Exception]):
        self.conn = conn
        self.fileno, self.poll = conn.fileno, conn.poll
        # HMAC states keyed once: a frame's tag copies one (0.5-1 us less than keying it anew)
        self._send_mac, self._recv_mac = (hmac.new(key, digestmod="sha256") for key in keys)
        self._sent = self._received = 0
        self.peer, self.error = peer, error
        self.rejected: str | None = None

    @staticmethod
    def _tag(keyed, seq: int, body) -> bytes:
        mac = keyed.copy()
        mac.update(seq.to_bytes(8, "little") + len(body).to_bytes(8, "little"))
        mac.update(body)
        return mac.digest()

    def send_bytes(self, body: bytes) -> None:
        self.conn.send_bytes(self.seal(body))

    def seal(self, body: bytes) -> bytes:
        """The next frame's body as sent: ``body`` and its tag (a worker's outbox writes it)."""
        tag = self._tag(self._send_mac, self._sent, body)
        self._sent += 1
        return body + tag

    def recv_bytes(self) -> memoryview:
        if self.rejected is None:
            frame = self.conn.recv_bytes()
            body = memoryview(frame)[:-TAG_BYTES]
            if len(frame) >= TAG_BYTES and hmac.compare_digest(
                    frame[-TAG_BYTES:], self._tag(self._recv_mac, self._received, body)):
                self._received += 1
                return body
            self.rejected = (f"frame {self._received} from {self.peer} failed authentication (tampered with, "
                             "injected or replayed on the way); it was not run, and the connection is dropped")
        raise self.error(self.rejected)

    def close(self) -> None:
        self.conn.close()


def _connection(sock: socket.socket, keys: tuple[bytes, bytes], peer: str = "the peer",
                error: type[Exception] = FrameRejected) -> _Sealed:
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _Sealed(Connection(sock.detach()), keys, peer, error)


def _accept(server: socket.socket, key: bytes, timeout: float) -> _Sealed:
    """The first connection that proves it holds ``key`` (others are dropped), within ``timeout``.

    Handshakes run side by side, each within ``HANDSHAKE_TIMEOUT`` in all (a peer that trickles
    bytes or says nothing is dropped then, and at most ``MAX_HANDSHAKES`` are open), and the host
    goes on accepting until the parent's proof arrives."""
    deadline = time.monotonic() + timeout
    server.setblocking(False)
    pending: dict[socket.socket, _Handshake] = {}  # oldest first
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)

    def drop(sock: socket.socket) -> None:
        del pending[sock]
        selector.unregister(sock)
        sock.close()

    try:
        while True:
            now = time.monotonic()
            for sock in [s for s, h in pending.items() if h.deadline <= now]:
                drop(sock)
            if now >= deadline:
                raise TimeoutError(f"no parent connected within {timeout:g} s")
            wait = min([deadline, *(h.deadline for h in pending.values())]) - now
            for ready, _ in selector.select(wait):
                if ready.fileobj is server:
                    try:
                        sock, address = server.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    if len(pending) >= MAX_HANDSHAKES:
                        drop(next(iter(pending)))
                    sock.setblocking(False)
                    try:
                        pending[sock] = _Handshake(sock, address, key, time.monotonic() + HANDSHAKE_TIMEOUT)
                    except OSError:
                        sock.close()
                        continue
                    selector.register(sock, selectors.EVENT_READ)
                    continue
                sock = ready.fileobj
                if sock not in pending:
                    continue
                try:
                    keys = pending[sock].advance()
                except OSError:
                    drop(sock)
                    continue
                if keys is not None:
                    peer = pending.pop(sock).peer
                    selector.unregister(sock)
                    return _connection(sock, keys, peer, ConnectionAbortedError)
    finally:
        for sock in pending:
            sock.close()
        selector.close()


def _sweep_dead_hosts() -> None:
    """Remove the temp roots of this machine's hosts whose process is gone without a cleanup (its
    raylet died with it, so no task could run there then)."""
    for root in Path(tempfile.gettempdir()).glob(f"{HOST_TEMP_PREFIX}*-*"):
        pid = root.name[len(HOST_TEMP_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove_workspace(str(root))


def _remove_workspace(path: str) -> None:
    """Delete a host's temp root: by the host as it closes, or as a Ray task on a killed host's
    node (Ray kills a dead actor's child processes, so nothing of the host's own can do it).
    Only ever an absolute path that a host made (never "", which would mean the working directory)."""
    if os.path.isabs(path) and Path(path).name.startswith(HOST_TEMP_PREFIX):
        remove_tree(Path(path))


# -- the parent side -----------------------------------------------------------------------------


def _lost_reason(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # a host's own error (RayTaskError wraps it in a traceback)
    if isinstance(cause, Exception):
        exc = cause
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


class _RayHost(_Channel):
    """The Ray transport: the parent's handle on one host actor and its connection.

    ``serving`` (the actor's ``serve`` call) settles when the host ends: with Ray's error when
    its actor or node died, which is how a host on a silent node is found lost.
    """

    def __init__(self, ray, actor_cls, options: dict, payload: bytes, mode: AutoresetMode, fresh: bool,
                 cleanups: list, keep: tuple[str, ...] | None = None):
        self.ray = ray
        self.dumps = ray.cloudpickle.dumps  # (call and set_attr arguments from __main__ too)
        self.cleanups = cleanups  # the vector env's pending workspace removals
        self.closed = False
        self.name = options["name"]
        self.key = os.urandom(32)
        self.actor = actor_cls.options(**options).remote(self.key)
        self.located = self.actor.where.remote()
        self.serving = self.actor.serve.remote(payload, mode.value, fresh, keep)
        self.conn: _Sealed | None = None
        self.info: dict[str, Any] = {}
        self.pid: int | None = None
        self.gone: str | None = None  # why the host is lost, once known

    def connect(self, timeout: float | None) -> None:
        """Connect once Ray says where the host listens (or that it never will: WorkerLost)."""
        done, _ = self.ray.wait([self.located, self.serving], num_returns=1, timeout=timeout)
        if not done:
            raise TimeoutError
        try:
            self.info = self.ray.get(self.located, timeout=0 if self.located in done else timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise TimeoutError from None
        except self.ray.exceptions.RayError as exc:
            raise WorkerLost(self._named(_lost_reason(exc))) from None
        self.pid = self.info["pid"]
        try:
            sock = socket.create_connection((self.info["ip"], self.info["port"]), timeout=HANDSHAKE_TIMEOUT)
            try:
                keys = _authenticate(sock, self.key, b"parent")
                self.conn = _connection(sock, keys, f"env host {self.name} at {self.info['ip']}:{self.info['port']}")
            except BaseException:
                sock.close()
                raise
        except OSError as exc:
            raise WorkerLost(self._named(f"cannot connect to {self.info['ip']}:{self.info['port']}: {exc}")) from None

    def _named(self, reason: str) -> str:
        return f"the env host {self.name} on {self.info.get('ip', 'its node')} was lost: {reason}"

    def lost_reason(self) -> str:
        """Ray's word on the host's end when it comes within moments, else the connection's."""
        if self.crashed:
            return self.crashed
        if self.gone is None:
            done, _ = self.ray.wait([self.serving], timeout=LOST_REASON_WAIT_S)
            self.gone = "its connection closed"
            if done:
                try:
                    self.ray.get(self.serving)
                except self.ray.exceptions.RayError as exc:
                    self.gone = _lost_reason(exc)
        return self._named(self.gone)

    def send(self, message: Any) -> None:
        if self.conn is None:
            self.connect(None)
        super().send(message)

    def recv(self, timeout: float | None = None) -> Any:
        if self.conn is None:
            start = time.monotonic()
            self.connect(timeout)
            timeout = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        if self.gone is not None and not self.conn.poll(0):
            raise WorkerLost(self._named(self.gone))
        return super().recv(timeout)

    def recv_ready(self) -> list[Any]:
        if self.gone is not None and not self.conn.poll(0):  # reported lost by Ray, nothing left to read
            raise WorkerLost(self._named(self.gone))
        return super().recv_ready()

    def alive(self) -> bool:
        return True  # a lost host shows as an error on its connection, or through ``serving``

    def close(self) -> None:
        if self.conn is not None:  # (one never connected is killed)
            super().close()

    def fileno(self) -> int | None:
        try:
            return None if self.conn is None else self.conn.fileno()
        except OSError:  # (closed)
            return None

    # Closing never calls Ray once it is shut down (at exit, say): Ray would start a new local
    # instance to serve the call, and the actors went with the old one anyway.

    def join(self, timeout: float) -> None:
        """Wait for a host that heard close to end. One never connected heard nothing: it waits in
        ``serve`` for a parent (``ACCEPT_TIMEOUT``), so it is not waited on, only killed next
        (where a closed connection does not show, without POLLRDHUP, close() waited out its whole
        grace on it, 10 s)."""
        if self.conn is not None and self.ray.is_initialized():
            done, _ = self.ray.wait([self.serving], timeout=timeout)
            self.closed = bool(done)

    def kill(self) -> None:
        """Kill the actor; unless it closed itself, remove its workspace with a task on its node."""
        if self.conn is not None:
            self.conn.close()
        if not self.ray.is_initialized():
            return
        if not self.info:  # never connected: where its workspace is, if it said so already (nothing waits for it)
            done, _ = self.ray.wait([self.located], timeout=0)
            if done:
                try:
                    self.info = self.ray.get(self.located, timeout=0)
                except self.ray.exceptions.RayError:
                    pass
        self.ray.kill(self.actor, no_restart=True)
        if self.info and not self.closed:
            self.closed = True
            where = self.ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(self.info["node_id"], soft=False)
            task = self.ray.remote(_remove_workspace).options(num_cpus=0, max_retries=0, scheduling_strategy=where)
            self.cleanups.append(task.remote(self.info["workspace"]))


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, a Ray Client
# server) answers with a SETTINGS frame of its own (type 4, the header's fourth byte)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
PROBE_TIMEOUT = 5.0


def _check_reachable(address: str) -> None:
    """Fail within seconds for an address nothing answers on, or where what answers is no Ray
    (a dashboard's port, a silent service): ray.init would retry there for many minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be 'auto', 'host:port' or 'ray://host:port', got {address!r}")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT)
    except OSError as exc:
        raise ConnectionError(f"no Ray cluster answers at address={address!r}: {exc}") from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return  # (the gRPC is inside TLS: no plain probe)
        try:
            sock.sendall(HTTP2_PREFACE)
            settings = _read_exactly(sock, 9, time.monotonic() + PROBE_TIMEOUT)[3] == 4
        except OSError:
            settings = False
    if not settings:
        raise ConnectionError(
            f"what listens at address={address!r} does not answer as a Ray cluster does (gRPC) within "
            f"{PROBE_TIMEOUT:g} s: give the Ray head's GCS address (port 6379 by default; 'ray://host:10001' "
            "for Ray Client), not its dashboard's (8265) or another service's")


def connect(ray, address: str | None) -> bool:
    """Join Ray (the connection this process has, else ``ray.init(address)``); True if we started it."""
    if ray.is_initialized():
        return False
    if address is not None and address not in ("auto", "local"):
        _check_reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ConnectionError(f"cannot join a Ray cluster at address={address!r}: {exc}") from None
    except RuntimeError as exc:
        if "Version mismatch" not in str(exc):
            raise
        detail = " ".join(str(exc).split()).removeprefix("Version mismatch: ")
        raise RuntimeError(
            f"Ray version mismatch between this process (ray {ray.__version__}, Python {sys.version.split()[0]}) "
            f"and the cluster at address={address!r}: {detail}. Install the cluster's versions here, or start "
            "the cluster with this process's") from None
    return True


class RayVectorEnv(WorkerVectorEnv):
    """Vectorised environments on Ray actors ("env hosts"), anywhere in a Ray cluster.

    Args:
        env: an environment id (made with ``gym.make(env, **env_kwargs)`` on the hosts), a
            function that makes one, or a list of such functions (pickled with cloudpickle; a
            function defined in ``__main__`` travels by value, one from a module needs that
            module installed on the hosts). Ids registered in Python here (``register_tool_env``)
            are registered on the hosts too, their tools and rubrics from ``__main__`` by value.
        num_envs: how many environments.
        num_hosts: host actors; environments are spread evenly over them. Default:
            ``ceil(num_envs / envs_per_host)``.
        envs_per_host: instead of ``num_hosts`` (default 16).
        actor_options: Ray actor options for each host, over the default
            ``{"num_cpus": 1, "scheduling_strategy": "SPREAD"}``: e.g. ``{"num_cpus": 1,
            "resources": {"benchmax_env_host": 1}}`` (the resource ``benchmax-gym launch``
            gives its nodes), a ``PlacementGroupSchedulingStrategy``, ``runtime_env``, memory.
        address: the Ray cluster to join when this process has not called ``ray.init``:
            ``"auto"`` (the one on this machine or in ``RAY_ADDRESS``), ``"host:port"``,
            ``"ray://host:10001"`` (Ray Client: this process must still reach the hosts' nodes,
            see above), or ``None`` (``ray.init()``: a running local cluster or a new one, shut
            down again by :meth:`close`).
        autoreset_mode, step_timeout, info_keys: as :class:`SubprocVectorEnv` (a host past ``step_timeout``
            is killed and replaced).
        start_timeout: seconds to get a host placed and running, retries included (at most 2,000,000).
        **env_kwargs: ``gym.make`` keyword arguments, with an id.
    """

    _kind = "env host"

    def __init__(
        self,
        env: str | Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
        num_envs: int | None = None,
        *,
        num_hosts: int | None = None,
        envs_per_host: int | None = None,
        actor_options: dict[str, Any] | None = None,
        address: str | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = None,
        start_timeout: float = 120.0,
        info_keys: Sequence[str] | None = None,
        **env_kwargs: Any,
    ):
        self._owns_ray = False
        ray = import_ray()
        fns = _env_fns(env, num_envs, env_kwargs, type(self))
        num_hosts = _host_count(len(fns), num_hosts, envs_per_host)
        start_timeout = seconds_arg("start_timeout", start_timeout)
        if actor_options is not None and not isinstance(actor_options, dict):
            raise ValueError(f"actor_options must be a dict of Ray actor options, got {actor_options!r}")
        if set(actor_options or ()) & set(_OURS):
            raise ValueError(f"actor_options may not set {sorted(set(actor_options) & set(_OURS))}: "
                             "RayVectorEnv names its hosts and restarts them itself")
        self._ray = ray
        self._actor_cls = ray.remote(_Host)
        # threaded: ``serve`` holds a thread for the host's life, ``where`` answers on the other
        self._options = {**DEFAULT_ACTOR_OPTIONS, **(actor_options or {}), "max_restarts": 0, "max_concurrency": 2}
        try:
            self._actor_cls.options(**self._options)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"actor_options: {exc}") from None
        self.start_timeout = float(start_timeout)
        self._run = uuid.uuid4().hex[:8]
        self._generation = 0
        self._payloads: dict[int, bytes] = {}
        self._registered: dict[str, bytes] | None = None  # (driver_registrations: made once, for every host)
        self._env_id = env if isinstance(env, str) else None
        self._cleanups: list = []  # workspace removals on killed hosts' nodes
        self._address = address  # joined in _start_all, once _setup has checked every argument
        self._setup(env, fns, num_hosts, autoreset_mode, step_timeout, info_keys)

    # -- the transport ---------------------------------------------------------------------------

    def _payload(self, w: int) -> bytes:
        """Host ``w``'s environment functions, pickled once (cloudpickle), or a TypeError naming
        the env whose function cannot travel to a host."""
        if w not in self._payloads:
            dumps = self._ray.cloudpickle.dumps
            if self._registered is None:
                self._registered = driver_registrations(dumps, self._env_id, "an env host (cloudpickle)")
            try:
                self._payloads[w] = dumps((self._registered, self._groups[w]))
            except Exception:
                for i, fn in self._groups[w].items():  # the first env that fails: the one to fix
                    try:
                        dumps(fn)
                    except Exception as exc:
                        raise TypeError(f"env: the function that makes env {i} ({fn!r}) cannot be sent to an "
                                        f"env host (cloudpickle): {type(exc).__name__}: {exc}") from exc
                raise
        return self._payloads[w]

    def _spawn(self, w: int, fresh: bool) -> _RayHost:
        self._generation += 1
        options = {**self._options, "name": f"benchmax-env-host-{self._run}-{w}-{self._generation}"}
        return _RayHost(self._ray, self._actor_cls, options, self._payload(w), self.autoreset_mode, fresh,
                        self._cleanups, self.info_keys)

    def _wait(self, ws: list[int], timeout: float | None) -> list[int]:
        """Hosts with messages; every second of silence, also those Ray reports dead (a node
        that vanished without closing its connections)."""
        hosts = {self._workers[w].conn: w for w in ws}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = LIVENESS_CHECK_S if deadline is None else min(LIVENESS_CHECK_S, max(0.0, deadline - time.monotonic()))
            ready = readable(list(hosts), left)
            if ready:
                return sorted(hosts[conn] for conn in ready)
            serving = {self._workers[w].serving: w for w in ws}
            ended, _ = self._ray.wait(list(serving), num_returns=len(serving), timeout=0)
            if ended:
                for ref in ended:
                    try:
                        self._ray.get(ref)
                        reason = "it ended its worker loop"
                    except self._ray.exceptions.RayError as exc:
                        reason = _lost_reason(exc)
                    self._workers[serving[ref]].gone = reason
                return sorted(serving[ref] for ref in ended)
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _start_all(self) -> None:
        """Join Ray (after ``_setup`` checked the arguments: a bad one starts no Ray, and a failure
        from here on shuts down a Ray this env started), then start every host side by side."""
        for w in range(len(self._groups)):  # (before any actor: an env that cannot travel starts none)
            self._payload(w)
        self._owns_ray = connect(self._ray, self._address)
        for w in range(len(self._groups)):
            self._workers.append(self._spawn(w, False))
        for w, host in enumerate(list(self._workers)):
            try:
                self._expect(host, "ready", self.start_timeout)
            except WorkerLost:  # its node died as it started: place it again
                host.kill()
                self._workers[w] = self._start(w, False)

    def _start(self, w: int, fresh: bool) -> _RayHost:
        """Start host ``w`` wherever Ray has room, retrying with backoff while hosts are lost
        as they start (a replacement may first land on the node that is dying)."""
        deadline = time.monotonic() + self.start_timeout
        delay = 0.25
        while True:
            host = self._spawn(w, fresh)
            try:
                self._expect(host, "ready", max(1.0, deadline - time.monotonic()))
                return host
            except WorkerLost as lost:
                host.kill()
                if time.monotonic() + delay >= deadline:
                    raise RuntimeError(f"no env host could be started within start_timeout={self.start_timeout:g} s; "
                                       f"the last attempt: {lost}") from None
                time.sleep(delay)
                delay = min(delay * 2, 8.0)

    def _expect(self, worker, kind: str, timeout: float = 120.0) -> Any:
        try:
            return super()._expect(worker, kind, timeout)
        except RuntimeError as exc:
            if kind != "ready" or "did not answer" not in str(exc):
                raise
            worker.kill()
            wanted = {k: v for k, v in self._options.items() if k in ("num_cpus", "num_gpus", "memory", "resources")}
            raise RuntimeError(
                f"no env host was placed and ready within {timeout:g} s: the cluster may have no free {wanted} "
                f"(its resources: {self._ray.cluster_resources()}); see actor_options and start_timeout") from None

    # -- what it offers beyond SubprocVectorEnv --------------------------------------------------

    @property
    def hosts(self) -> list[dict[str, Any]]:
        """Each host's ``pid``, ``node_id``, ``ip`` and ``workspace`` (its temp root on its node)."""
        return [dict(h.info, name=h.name) for h in self._workers]

    def close_extras(self, **kwargs: Any) -> None:
        super().close_extras(**kwargs)
        if self._cleanups and self._ray.is_initialized():  # (a dead node's fail at once)
            self._ray.wait(self._cleanups, num_returns=len(self._cleanups), timeout=10)
        if self._owns_ray:
            self._owns_ray = False
            self._ray.shutdown()


def _host_count(num_envs: int, num_hosts: int | None, envs_per_host: int | None) -> int:
    def positive_int(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    if num_hosts is not None and envs_per_host is not None:
        raise ValueError("give num_hosts or envs_per_host, not both")
    if envs_per_host is not None:
        if not positive_int(envs_per_host):
            raise ValueError(f"envs_per_host must be a positive int, got {envs_per_host!r}")
        return math.ceil(num_envs / envs_per_host)
    if num_hosts is None:
        return math.ceil(num_envs / DEFAULT_ENVS_PER_HOST)
    if not positive_int(num_hosts) or num_hosts > num_envs:
        raise ValueError(f"num_hosts must be an int from 1 to num_envs={num_envs}, got {num_hosts!r}")
    return num_hosts
