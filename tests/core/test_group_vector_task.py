"""score_vector_group over worker processes: each env sends back only the task it just played
(``episode_task()``), not its whole Episode: that carried the transcript over the pipe, and
could not be sent at all where the episode holds what cannot be pickled (CRM's database
connection, Math's Python sandbox), so group functions that ask for ``task`` or ``answer`` got
None. An env without the method still sends its episode, and Gymnasium's AsyncVectorEnv (which
shuts down a worker whose call raised) keeps its workers."""

import functools
import logging
import pickle

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.core.group import GroupRubric, score_vector_group
from benchmax_gym.wrappers import SubprocVectorEnv


def _seen_by_group(envs, k):
    """What a group function that asks for ``task`` and ``answer`` is given."""
    seen = []

    def look(rewards, task, answer):
        seen.append((task, answer))
        return [0.0] * len(rewards)

    score_vector_group(envs, GroupRubric([("look", look)]))
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("env_id, kwargs, action", [
    ("benchmax/CRM-v0", {}, "The answer is nobody"),
    ("benchmax/Math-v0", {}, "\\boxed{0}"),
])
def test_group_functions_get_the_task_of_episodes_that_cannot_be_pickled(env_id, kwargs, action, caplog):
    """A CRM episode holds its sqlite connection (Math's, its Python sandbox): the whole episode
    could not be sent, and every group function was given task=None, answer=None, with a warning."""
    local = gym.make(env_id, **kwargs)
    local.reset(seed=0, options={"task_index": 2})
    expected = local.unwrapped.episode.task
    if env_id == "benchmax/CRM-v0":
        with pytest.raises(TypeError):  # (what the test is about: the episode cannot be sent)
            pickle.dumps(local.unwrapped.episode)
    local.close()
    k = 3
    envs = SubprocVectorEnv([functools.partial(gym.make, env_id, **kwargs)] * k, num_workers=2, context="fork")
    try:
        envs.reset(seed=0, options=[{"task_index": 2}] * k)
        _, _, terminated, _, _ = envs.step([action] * k)
        assert terminated.all()
        with caplog.at_level(logging.WARNING, logger="benchmax_gym"):
            task, answer = _seen_by_group(envs, k)
        assert task is not None and task.id == expected.id and answer == expected.answer
        assert "could not be read" not in caplog.text
    finally:
        envs.close()


def test_gymnasiums_async_vector_env_keeps_its_workers_and_gets_the_tasks():
    """Asking a Gymnasium AsyncVectorEnv's env for a method it lacks shuts its worker down: the
    method is asked for only where every env has it (else the episode is read, as before)."""
    k = 2
    envs = gym.vector.AsyncVectorEnv([lambda: gym.make("benchmax/Math-v0", python_tool=False)] * k,
                                     context="fork")
    try:
        envs.reset(seed=0, options={"task_index": 1})
        answer = gym.make("benchmax/Math-v0", python_tool=False).unwrapped.tasks.get(1).answer
        envs.step([f"\\boxed{{{answer}}}"] * k)
        task, got = _seen_by_group(envs, k)
        assert got == answer and task.id
        envs.step(["\\boxed{0}"] * k)  # (autoreset) the workers are all still there
        _, rewards, _, _, _ = envs.step(["\\boxed{0}"] * k)
        assert len(rewards) == k
    finally:
        envs.close()
