"""A real env that reports failures as the engine does (issue 29): ``benchmax-test/FlakyMath-v0``
is ``benchmax/Math-v0`` whose chosen tasks (``fail_tasks``) end at their first step with
``info["outcome"] = "tool_unavailable"`` and reward NaN, as does any step whose reply holds
``fail_marker`` (a fault injected per sample); the others end with ``"scored"``.
Importing this module registers the id (subprocesses import it too)."""

import math

import gymnasium as gym

ENV_ID = "benchmax-test/FlakyMath-v0"


class FailTasks(gym.Wrapper):
    """The tasks in ``fail_tasks`` lose their tool backend at the first step."""

    def __init__(self, env, fail_tasks=(), fail_marker=None):
        super().__init__(env)
        self.fail_tasks, self.fail_marker, self.task = {int(t) for t in fail_tasks}, fail_marker, None

    def reset(self, *, seed=None, options=None):
        self.task = (options or {}).get("task_index")
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.task in self.fail_tasks or (self.fail_marker and self.fail_marker in str(action)):
            return obs, math.nan, True, False, {**info, "outcome": "tool_unavailable"}
        if terminated or truncated:
            info = {**info, "outcome": "truncated" if truncated else "scored"}
        return obs, reward, terminated, truncated, info


def scripted_by_kind(fault: int | None, wrong: int, marker: str = "FAULT", kinds: int = 3):
    """A ``generate`` for :class:`TRLRollout` with ``kinds`` samples a prompt: each sample answers
    as the reference solver does, except the one of kind ``fault`` (the k-th seen, modulo
    ``kinds``), which writes ``marker`` (FlakyMath fails it), and the one of kind ``wrong``, whose
    answer is wrong (-1)."""
    from benchmax_gym.testing.tokenizers import model_ids

    order = []

    def scripted(trainer, sessions):
        ids = []
        for s in sessions:
            if id(s) not in order:
                order.append(id(s))
            reply = s.env.unwrapped.reference_solver()(s.obs, s.info)
            kind = order.index(id(s)) % kinds
            if kind == fault:
                reply = f"{marker} {reply}"
            elif kind == wrong and s.info["turn"] > 0:
                reply = "The answer is \\boxed{-1}"
            ids.append(model_ids(s.chat, reply))
        return ids, [None] * len(ids)

    return scripted


def _make(fail_tasks=(), fail_marker=None, **kwargs):
    import benchmax_gym  # noqa: F401

    return FailTasks(gym.make("benchmax/Math-v0", **kwargs), fail_tasks, fail_marker)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=_make, disable_env_checker=True)
