"""OpenRLHF: an env that cannot be built (one row's bad argument, a backend that would not come
up) is a failed sample, as an env whose reset or step raises is: ``env_error``, NaN, the env id
and the error in ``outcome_detail``, the row's prompt and no action range. (Building it raised
out of ``execute``; OpenRLHF's ``generate_responses`` gathers a prompt's samples without
``return_exceptions``, so one such row failed the engine's Ray call and ended training.) An
interrupt while building still stops the run. Played as OpenRLHF's engine plays a prompt (one
gather), then through OpenRLHF's own samples generator and Experience concat."""

import asyncio
import json
import math

import gymnasium as gym
import pytest
from test_openrlhf import SolverEngine, _experiences, _params

from benchmax_gym.adapters.openrlhf import make_executor, task_rows
from benchmax_gym.core.group import GroupRubric, diversity_penalty

ENV_ID = "benchmax-test/OpenRLHFUnbuildable-v0"
BUILD_FAILS: list[BaseException] = []  # what the next builds of ENV_ID raise, in order


def _make(unbuildable=False, **kwargs):
    """benchmax/Math-v0, except a build while ``BUILD_FAILS`` holds an error (a backend that
    comes and goes) or with ``unbuildable`` (one that never comes up) raises."""
    if unbuildable:
        raise ConnectionRefusedError("the env's database server refused the connection\n(port 5432)")
    if BUILD_FAILS:
        raise BUILD_FAILS.pop(0)
    return gym.make("benchmax/Math-v0", **kwargs)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=_make, disable_env_checker=True)


def _row(row, env_id=None, **env_kwargs):
    label = json.loads(row["label"])
    return {**row, "label": json.dumps({**label, "env_id": env_id or label["env_id"], "env_kwargs": env_kwargs})}


def test_an_env_that_cannot_be_built_is_a_failed_sample_openrlhfs_generate_responses_keeps(qwen_tokenizer, caplog):
    """A gather of three samples (the rows name their env): one played, one whose row has a bad
    argument (``max_turn``), one whose backend refuses it: every sample comes back, the two
    failed ones env_error with NaN scores, naming their env and error, logged with their
    tracebacks; OpenRLHF's samples generator and Experience concat take the batch."""
    executor = make_executor()()
    row = task_rows(ENV_ID, 1)[0]
    rows = [row, _row(row, "benchmax/Math-v0", max_turn=3), _row(row, unbuildable=True)]
    engine = SolverEngine(qwen_tokenizer, "benchmax/Math-v0")

    async def main():
        return await asyncio.gather(*(executor.execute(r["prompt"], r["label"], _params(1), 4096,
                                                       qwen_tokenizer, engine) for r in rows))

    played, bad_argument, refused = asyncio.run(main())
    assert played["reward"] == 1.0 and played["outcome_detail"] == ""
    for failed in (bad_argument, refused):
        assert math.isnan(failed["reward"]) and math.isnan(failed["scores"]) and failed["truncated"] is False
        assert failed["extra_logs"]["env/outcome/env_error"] == 1.0 and math.isnan(failed["extra_logs"]["reward"])
        assert failed["extra_logs"].keys() == played["extra_logs"].keys()
        assert failed["action_ranges"] == [] and failed["turn_rewards"] == []  # no reply was asked for
        # its prompt is the row's, with a logprob (0) per token as OpenRLHF stacks them
        assert qwen_tokenizer.decode(failed["observation_tokens"]).count(row["prompt"][-1]["content"]) == 1
        assert len(failed["rollout_log_probs"]) == len(failed["observation_tokens"])
    assert bad_argument["outcome_detail"].startswith(
        "benchmax/Math-v0 task 0: building the env raised TypeError: ") and "max_turn" in bad_argument["outcome_detail"]
    assert refused["outcome_detail"] == (f"{ENV_ID} task 0: building the env raised ConnectionRefusedError: the env's "
                                         "database server refused the connection (port 5432)")
    assert caplog.text.count("building the env raised; the sample fails (env_error)") == 2
    assert 'raise ConnectionRefusedError("the env' in caplog.text  # (with its traceback)
    exps, batch = _experiences([played, bad_argument, refused], 4096)
    assert batch.sequences.shape[0] == 3 and batch.info["env/outcome/env_error"].tolist() == [0.0, 1.0, 1.0]
    assert not exps[2].action_mask.any() and exps[0].action_mask.any()  # no token of it in the loss


def test_a_group_member_that_cannot_be_built_is_no_member_and_its_siblings_do_not_wait(qwen_tokenizer):
    """group_size=2: one of a prompt's samples cannot build its env (its backend was down for
    that build); it fails (NaN, not a member), and its sibling is group-scored without waiting
    for it (group_timeout is far past the hang guard)."""
    executor = make_executor(ENV_ID, group_size=2, group_timeout=600,
                             group_rubric=GroupRubric([("diverse", diversity_penalty, 0.5)]))()
    row = task_rows(ENV_ID, 1)[0]
    engine = SolverEngine(qwen_tokenizer, "benchmax/Math-v0")
    BUILD_FAILS[:] = [OSError("the env's sandbox host is down")]

    async def main():
        play = [executor.execute(row["prompt"], row["label"], _params(), 4096, qwen_tokenizer, engine)
                for _ in range(2)]
        return await asyncio.wait_for(asyncio.gather(*play), 60)

    try:
        outputs = asyncio.run(main())
    finally:
        BUILD_FAILS.clear()
    failed = [o for o in outputs if o["outcome_detail"]]
    scored = [o for o in outputs if not o["outcome_detail"]]
    assert len(failed) == len(scored) == 1
    assert math.isnan(failed[0]["reward"]) and "the env's sandbox host is down" in failed[0]["outcome_detail"]
    assert scored[0]["reward"] == 1.0 and scored[0]["extra_logs"]["env/outcome/scored"] == 1.0


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_the_env_is_built_still_stops_the_run(qwen_tokenizer, stop):
    executor = make_executor(ENV_ID)()
    row = task_rows(ENV_ID, 1)[0]
    BUILD_FAILS[:] = [stop()]
    try:
        with pytest.raises(stop):
            asyncio.run(executor.execute(row["prompt"], row["label"], _params(), 4096, qwen_tokenizer,
                                         SolverEngine(qwen_tokenizer, "benchmax/Math-v0")))
    finally:
        BUILD_FAILS.clear()
