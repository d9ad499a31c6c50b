"""Wrappers over benchmax-gym environments (installed as ``benchmax_gym.wrappers``)."""

import signal
import sys
import threading


def _import_multiprocess_holding_ctrl_c() -> None:
    """Import multiprocess with Ctrl-C held until it is in: dill, which it imports, reads its
    version under a bare ``except:`` that turns a KeyboardInterrupt landing there into ImportError,
    and multiprocess catches that to go on with plain pickle. Ctrl-C was lost (the command ran on,
    its workers unable to pickle what dill can); held, it comes right after the import."""
    held = (threading.current_thread() is threading.main_thread() and "multiprocess.reduction" not in sys.modules
            and signal.getsignal(signal.SIGINT) is not None)  # (None: a handler not set from Python, not put back)
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum)) if held else None
    try:
        import multiprocess.reduction  # noqa: F401
    finally:
        if held:
            signal.signal(signal.SIGINT, previous)
    if pressed:
        signal.raise_signal(signal.SIGINT)


_import_multiprocess_holding_ctrl_c()

from .ray_vector import RayVectorEnv  # noqa: E402
from .record import RecordEpisodes  # noqa: E402
from .vector import SubprocVectorEnv  # noqa: E402

__all__ = ["RayVectorEnv", "RecordEpisodes", "SubprocVectorEnv"]
