"""Warnings that point at the user's line: ``gym.make``'s caller, not Gymnasium's registration.py
(a fixed ``stacklevel`` lands wherever the call path through Gymnasium and the family happens to be)."""

from __future__ import annotations

import os
import sys
import warnings

import gymnasium

_INSIDE = tuple({os.path.dirname(os.path.abspath(p)) + os.sep
                 for mod in (gymnasium, sys.modules["benchmax_gym"]) for p in (mod.__file__, os.path.realpath(mod.__file__))})
_TOP = os.path.dirname(os.path.dirname(os.path.realpath(sys.modules["benchmax_gym"].__file__)))
_INSIDE += tuple(os.path.join(_TOP, name) + os.sep for name in ("wrappers", "registry"))  # (linked into the package)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside benchmax-gym and Gymnasium."""
    frame, level = sys._getframe(1), 2  # (stacklevel 2: the caller of warn())
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
