"""Evaluate any policy on any environment: a model endpoint, a baseline or your function.

``benchmax-gym eval ENV_ID --model NAME --base-url URL --out runs/NAME`` or, from Python,
:func:`evaluate`. Statistics (pass@k, IQM and bootstrap CIs) are in :mod:`.stats`.
"""

from benchmax_gym.eval.policies import ChatPolicy, FunctionPolicy, PolicyError, Turn
from benchmax_gym.eval.runner import EvalError, EvalResult, aevaluate, evaluate, load_run

__all__ = ["ChatPolicy", "EvalError", "EvalResult", "FunctionPolicy", "PolicyError", "Turn", "aevaluate",
           "evaluate", "load_run"]
