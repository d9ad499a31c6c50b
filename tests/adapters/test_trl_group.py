"""Group rewards through TRL, which hands the whole batch (each prompt's num_generations samples)
to the env side: TRLRollout's rollout_func and environment_factory's reward function."""

import tempfile

import pytest

from benchmax_gym.core.group import GroupRubric, diversity_penalty, relative_rank
from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.testing.tokenizers import model_ids, tiny_model


@pytest.fixture
def output_dir():
    path = tempfile.mkdtemp(prefix="benchmax-trl-group-")
    yield path
    remove_tree(path)


def test_rollout_func_scores_each_group_together_and_leaves_failures_out(qwen_tokenizer, output_dir):
    """FlakyMath, 3 samples a prompt: right, wrong, failed. The group rank is over the two scored
    ones; the failed sample stays out of the group and the loss."""
    from flaky import ENV_ID, scripted_by_kind
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    seen = []
    scripted = scripted_by_kind(fault=2, wrong=1)

    rank = GroupRubric([("rank", relative_rank)], combine="replace")
    rollout = TRLRollout(ENV_ID, qwen_tokenizer, env_kwargs={"fail_marker": "FAULT"}, generate=scripted,
                         group_rubric=rank)
    original = rollout.__call__

    class Spy(TRLRollout):
        def __call__(self, prompts, trainer):
            seen.append(original(prompts, trainer))
            return seen[-1]

    rollout.__class__ = Spy
    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=6, num_generations=3,
                      max_completion_length=2048, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no")
    trainer = GRPOTrainer(model=tiny_model(qwen_tokenizer), reward_funcs=rollout.reward, args=args,
                          train_dataset=rollout.dataset(4), rollout_func=rollout, processing_class=qwen_tokenizer)
    trainer.train()
    rollout.close()
    rewards = seen[0]["env_reward"]
    assert rewards == [1.0, 0.0, None] * 2  # rank among the scored two; the failed one is None
    assert all(sum(m) == 0 for m in seen[0]["env_mask"][2::3])


def test_environment_factory_reward_scores_each_run_of_one_task_together():
    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment("benchmax/Math-v0", group_rubric=GroupRubric([("diverse", diversity_penalty, 1.0)]))
    rows = Env.dataset(2)
    envs = [Env() for _ in range(4)]
    for env, row in zip(envs, [rows[0], rows[0], rows[1], rows[1]]):
        env.reset(**row)
    answer = envs[0].calculator(expression=rows[0]["prompt"][-1]["content"].split(":", 1)[1].strip()).strip()
    completions = [f"\\boxed{{{answer}}}", f"\\boxed{{{answer}}}", "\\boxed{1}", "\\boxed{2}"]
    rewards = Env.reward([[{"role": "assistant", "content": c}] for c in completions], environments=envs)
    assert rewards == [0.0, 0.0, 0.0, 0.0]  # right but alike (1 - 1 each); wrong and distinct
    with pytest.raises(TypeError, match="group_rubric"):
        trl_environment("benchmax/Math-v0", group_rubric=relative_rank)


def _two_processes(tmp_path, *args):
    """``trl_two_processes.py tmp_path *args`` on two CPU processes (gloo, loopback only), both exiting 0."""
    from pathlib import Path

    from launch import start_ranks, two_process_env

    root = Path(__file__).resolve().parents[2]
    logs = [tmp_path / f"log{r}" for r in range(2)]
    procs = start_ranks(Path(__file__).with_name("trl_two_processes.py"), [tmp_path, *args],
                        two_process_env(port=True), root, logs)
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:  # one failed: the other waits at a collective call
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)


def test_rollout_func_decides_each_group_whole_when_trl_splits_it_over_two_processes(tmp_path):
    """A real GRPOTrainer on two CPU processes (gloo, loopback only), two steps, 2 samples a prompt,
    3 a process: TRL's sampler gives process 0 [a, a, b] and process 1 [b, c, c]. The group rubric
    (each member's score: its group's size) sees both members of b; when process 0's b fails,
    failed_group="drop" drops process 1's b too."""
    import json

    _two_processes(tmp_path)
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert [c["num_processes"] for c in first + second] == [2] * 4
    assert [c["process_index"] for c in first + second] == [0, 0, 1, 1]
    for zero, one in zip(first, second):  # each step: [a, a, b] and [b, c, c], b split
        assert zero["tasks"][0] == zero["tasks"][1] and zero["tasks"][2] == one["tasks"][0]
        assert one["tasks"][1] == one["tasks"][2] and len({zero["tasks"][0], one["tasks"][0], one["tasks"][2]}) == 3
    # step 1, no failure: every group rubric saw its 2 members, b's on both processes
    assert first[0]["env_reward"] == [2.0, 2.0, 2.0] and second[0]["env_reward"] == [2.0, 2.0, 2.0]
    # step 2, process 0's b failed: b is dropped on both processes, a and c are kept
    assert first[1]["env_reward"] == [2.0, 2.0, None] and second[1]["env_reward"] == [None, 2.0, 2.0]
    assert [m == 0 for m in first[1]["mask_sums"]] == [False, False, True]
    assert [m == 0 for m in second[1]["mask_sums"]] == [True, False, False]


def test_rollout_func_calls_the_trainers_generation_in_lock_step_on_every_process(tmp_path):
    """The trainer's generation is a collective call on several processes (vLLM's server mode
    gathers every process's prompts and hands each the slice at process_index * len(prompts)):
    with process 0's episodes taking three turns and process 1's one, both processes call it
    three times with three prompts each (process 1's padded), and each episode gets its own
    replies."""
    import json

    _two_processes(tmp_path, "lockstep")
    zero, one = (json.loads((tmp_path / f"lockstep{r}.json").read_text()) for r in range(2))
    assert zero["counts"] == one["counts"] == [3, 3, 3]
    assert [e["turns"] for e in zero["episodes"][0]] == [3, 3, 3]
    assert [e["turns"] for e in one["episodes"][0]] == [1, 1, 1]
    assert {e["outcome"] for e in zero["episodes"][0] + one["episodes"][0]} == {"scored"}
    assert all(e["reward"] is not None for e in zero["episodes"][0] + one["episodes"][0])


def test_environment_factory_reward_scores_each_group_whole_when_trl_splits_it_over_two_processes(tmp_path):
    """Env.reward, as TRL calls it on each of two CPU processes (a real GRPOTrainer, one step,
    environment_factory): process 0 has [a, a, b] and process 1 [b, c, c]. The group rubric (each
    member's score: its group's size) scores b once, both members, on process 0; each process gets
    its own samples' rewards."""
    import json

    _two_processes(tmp_path, "environment_factory")
    zero, one = (json.loads((tmp_path / f"env{r}.json").read_text()) for r in range(2))
    assert [len(p["calls"]) for p in (zero, one)] == [1, 1]
    assert [p["calls"][0]["process_index"] for p in (zero, one)] == [0, 1]
    a, _, b = zero["calls"][0]["tasks"]
    b1, c, _ = one["calls"][0]["tasks"]
    assert zero["calls"][0]["tasks"] == [a, a, b] and one["calls"][0]["tasks"] == [b, c, c]
    assert b1 == b and len({a, b, c}) == 3
    assert zero["groups"] == [[a, a], [b, b]] and one["groups"] == [[c, c]]  # b scored once, whole
    assert zero["calls"][0]["rewards"] == [2.0, 2.0, 2.0] and one["calls"][0]["rewards"] == [2.0, 2.0, 2.0]
    # called without TRL's keywords (no num_generations): runs of one task in the gathered order
    assert zero["direct_groups"] == [[a, a], [b, b]] and one["direct_groups"] == [[c, c]]
    assert zero["direct"] == [2.0, 2.0, 2.0] and one["direct"] == [2.0, 2.0, 2.0]


def test_two_groups_of_the_same_prompt_stay_apart(qwen_tokenizer):
    """GRPOTrainer's groups are runs of num_generations samples: two groups of one prompt in a row
    (a dataset row twice) are two groups, for failed_group and the group rubric alike."""
    from types import SimpleNamespace

    from flaky import ENV_ID

    from benchmax_gym.adapters.trl import TRLRollout

    def size(rewards):
        return [float(len(rewards))] * len(rewards)

    sessions_seen = []

    def scripted(trainer, sessions):
        ids = []
        for s in sessions:
            if id(s) not in sessions_seen:
                sessions_seen.append(id(s))
            reply = s.env.unwrapped.reference_solver()(s.obs, s.info)
            ids.append(model_ids(s.chat, ("FAULT " if sessions_seen.index(id(s)) == 0 else "") + reply))
        return ids, [None] * len(ids)

    rollout = TRLRollout(ENV_ID, qwen_tokenizer, env_kwargs={"fail_marker": "FAULT"}, generate=scripted,
                         failed_group="drop", group_rubric=GroupRubric([("size", size)], combine="replace"))
    trainer = SimpleNamespace(max_completion_length=2048, _metrics=None, num_generations=2,
                              model=SimpleNamespace(training=True))
    prompt = rollout.dataset(1)["prompt"][0]
    out = rollout([prompt] * 6, trainer)
    rollout.close()
    assert out["env_reward"] == [None, None, 2.0, 2.0, 2.0, 2.0]
    assert [sum(m) == 0 for m in out["env_mask"]] == [True, True, False, False, False, False]
