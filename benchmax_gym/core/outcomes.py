"""How an episode ended: the one closed set every path reports (issue 29).

A failure that is not the model's (a worker lost, a tool that timed out, a server gone, a model
endpoint that failed, a deadline) must never look like a wrong answer: only ``scored`` and
``truncated`` episodes are training signal and enter statistics. The model's own mistakes (bad
JSON, an unknown tool, wrong arguments, a tool error its input caused) are part of ``scored``
episodes.

A finished episode's last ``info`` carries ``info["outcome"]``; steps before it carry no
``outcome`` key. A failed episode's also carries ``info["outcome_detail"]``: why, in one line
(:func:`outcome_detail`: the failing tool's message, the reward's or simulated user's exception,
the time limit; for a lost worker, its error), for logs and eval's records (``record["error"]``).
It is the host's: the model's observation only says that the episode could not be graded.

A failed episode's reward is ``None`` in records (eval's ``rollouts.jsonl``, ``episode_record()``)
and ``float("nan")`` where an API must return a float (``step()``, a vector env's reward array).
A failure ends the episode at the step it happens in with ``terminated=False, truncated=True``
(Gymnasium's truncation: cut off from outside the task, not ended by the model), ungraded, its
resources released.

Whose fault: a failure is classified where it happens (a tool raises
:class:`~benchmax_gym.core.tools.ToolFailure` with its outcome):

* the model's, hence ``scored``: anything its input caused - unparsable or unknown calls, bad
  arguments, a :class:`~benchmax_gym.core.tools.ToolError` (bad SQL, a missing sheet), an
  exception a tool raises on its input (``tool_error``), and model-written code that loops or
  sleeps until the sandbox's call timeout kills it (``info["error"] == "tool_timeout"``, the
  episode goes on): the model wrote that code.
* ``tool_timeout``: a tool itself (not model code) ran past ``tool_timeout`` and the engine gave
  up on it; an MCP call past its timeout (the server is restarted, its state lost).
* ``tool_unavailable``: the sandbox server failed to start, or died under isolated code (the
  ``bubblewrap`` level; at ``rlimits`` the code can kill its own server, so there it stays the
  model's error - a model must not escape a bad reward by breaking its tools); an MCP server's
  process or transport went away; a remote backend (live Wikipedia) unreachable or failing past
  its retries.
* ``env_error``: the environment broke under the model: the sandbox server's internal error
  (isolated level), a family's state gone (the CRM database unusable), a vector worker or Ray
  host lost. (A sandbox channel out of step means code escaped isolation: the model's, scored.)
* ``model_error`` from a reward: a component that cannot score (a judge endpoint failing past
  its retries) raises :class:`RewardFailure`; the episode ends ungraded with its outcome,
  never a 0.
* ``deadline``: ``episode_timeout`` passed - a step that starts after it, or a call cut short by
  it (each call's timeout is bounded by the time left).
"""

from __future__ import annotations

import math
import warnings

SCORED = "scored"  #: the rubric ran on what the model did, right or wrong
TRUNCATED = "truncated"  #: turn or token limit: graded as it stands, and marked
ENV_ERROR = "env_error"  #: the environment itself failed (an exception, a worker or host lost)
TOOL_TIMEOUT = "tool_timeout"  #: a tool ran past its timeout for reasons not the model's
TOOL_UNAVAILABLE = "tool_unavailable"  #: a tool's backend is gone (sandbox died, MCP server closed)
MODEL_ERROR = "model_error"  #: the model endpoint failed (HTTP errors, malformed replies)
DEADLINE = "deadline"  #: the episode's wall-clock deadline (``episode_timeout=``) passed
CANCELLED = "cancelled"  #: stopped from outside (Ctrl-C, a closed env mid-episode)

#: outcomes whose reward is a training signal
SIGNAL = frozenset({SCORED, TRUNCATED})
#: outcomes that are failures: no reward, never in a loss, a baseline or a statistic
FAILURES = frozenset({ENV_ERROR, TOOL_TIMEOUT, TOOL_UNAVAILABLE, MODEL_ERROR, DEADLINE, CANCELLED})
OUTCOMES = SIGNAL | FAILURES


class RewardFailure(Exception):
    """Raised by a reward component that cannot score for reasons not the model's (a judge model
    unreachable, its reply unusable past retries). Unlike any other exception in a component
    (scored 0 and logged), it ends the episode ungraded with ``outcome`` (``model_error`` by
    default): a failure is never a reward.

    Its message is the failure's reason in ``info["outcome_detail"]`` and eval's records: say
    what failed (a tool's name, a timeout, an exception's type), never what a grader said (a
    judge's reply, a grading tool's text may quote the answer); log that instead."""

    def __init__(self, message: str, outcome: str = MODEL_ERROR):
        if outcome not in FAILURES:
            raise ValueError(f"outcome must be one of {sorted(FAILURES)}, got {outcome!r}")
        super().__init__(message)
        self.outcome = outcome


MAX_DETAIL_CHARS = 500


def outcome_detail(text: str) -> str:
    """A failure's reason as ``info["outcome_detail"]`` carries it: one line, at most
    :data:`MAX_DETAIL_CHARS` characters (an exception's text may run to pages)."""
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_DETAIL_CHARS else line[:MAX_DETAIL_CHARS - 3] + "..."


def is_failure(outcome: str | None) -> bool:
    """True for a failed episode; ``None`` (an episode not finished) is not a failure."""
    return outcome in FAILURES


def failed_reward() -> float:
    """The float a failed episode's step returns where an API needs one: NaN, never 0.

    gym.make wraps an env in Gymnasium's PassiveEnvChecker (an id registered with Gymnasium's
    defaults, or any id with ``disable_env_checker=False``), which checks its first step only and
    warns "The reward is a NaN value." when it is NaN: for a failure that is the design,
    so that one message from that one module is ignored from the first failure on (set here, at
    the failure, so a ``catch_warnings`` around an earlier import cannot undo it; Python's filters
    are per process, so another env's NaN first step goes unflagged too)."""
    warnings.filterwarnings("ignore", message=r"(?s).*The reward is a NaN value", category=UserWarning,
                            module=r"gymnasium\.utils\.passive_env_checker")
    return math.nan


__all__ = ["CANCELLED", "DEADLINE", "ENV_ERROR", "FAILURES", "MAX_DETAIL_CHARS", "MODEL_ERROR", "OUTCOMES", "RewardFailure",
           "SCORED", "SIGNAL", "TOOL_TIMEOUT", "TOOL_UNAVAILABLE", "TRUNCATED", "failed_reward", "is_failure", "outcome_detail"]
