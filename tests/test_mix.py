"""benchmax/Mix-v0: weighted members in one env (the contract suite covers it as a registered id;
the curriculum controller alone is in tests/test_curriculum.py)."""

import asyncio
import json
import math

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.testing import play

THREE = [("benchmax/Math-v0", 0.5), ("benchmax/Wikipedia-v0", 0.3), ("benchmax/CRM-v0", {"tool_format": "json"}, 0.2)]
TWO = [("benchmax/Math-v0", 0.5), ("benchmax/Wikipedia-v0", 0.5)]
# a member that cannot be built offline (it needs a dataset): never drawn, so never built
UNBUILDABLE = ("benchmax/Excel-SpreadsheetBench-v0", 0.0)


def tool_names(info):
    return sorted(t["function"]["name"] for t in info["tools"])


def test_each_reset_plays_one_member_with_its_own_prompt_tools_and_format():
    mix = gym.make("benchmax/Mix-v0", members=THREE)
    seen = {}
    for _ in range(12):
        obs, info = mix.reset()
        seen.setdefault(info["member"], (obs, info))
    assert set(seen) == {"Math-v0", "Wikipedia-v0", "CRM-v0"}
    for member, env_id, kwargs in [("Math-v0", "benchmax/Math-v0", {}), ("Wikipedia-v0", "benchmax/Wikipedia-v0", {}),
                                   ("CRM-v0", "benchmax/CRM-v0", {"tool_format": "json"})]:
        own = gym.make(env_id, **kwargs)
        obs, info = own.reset()
        mixed_obs, mixed_info = seen[member]
        assert tool_names(mixed_info) == tool_names(info)
        system = info["messages"][0]["content"]
        assert mixed_info["messages"][0]["content"] == system  # its prompt, in its tool format
        assert mixed_info["task_id"].startswith(f"{member}/")
        own.close()
    assert mix.observation_space.contains("any text") and mix.action_space.contains("any text")
    mix.close()


def test_options_member_forces_one_and_a_wrong_name_is_refused_naming_the_option():
    mix = gym.make("benchmax/Mix-v0", members=TWO)
    for _ in range(5):
        _, info = mix.reset(options={"member": "Wikipedia-v0"})
        assert info["member"] == "Wikipedia-v0"
    _, info = mix.reset(options={"member": "Math-v0", "task_index": 3})
    assert info["member"] == "Math-v0" and info["task_index"] == 3
    with pytest.raises(ValueError, match=r"options\['member'\] must be one of \['Math-v0', 'Wikipedia-v0'\]"):
        mix.reset(options={"member": "Excel-v0"})
    mix.close()


def test_a_step_method_held_from_before_a_reset_steps_the_episode_playing_now():
    """``gym.make`` returns the mixture itself (no wrapper looks ``step`` up anew): a loop that
    took ``env.step`` once steps each new episode's member, and before the first reset or after
    close it is told to reset."""
    mix = gym.make("benchmax/Mix-v0", members=TWO)
    with pytest.raises(gym.error.ResetNeeded):
        mix.step("hello")
    mix.reset(options={"member": "Wikipedia-v0"})
    step = mix.step  # (taken mid-episode: it must not stay bound to this episode)
    for member in ("Math-v0", "Wikipedia-v0", "Math-v0"):
        mix.reset(options={"member": member})
        obs, reward, terminated, truncated, info = step("\\boxed{1} <answer>1</answer>")
        assert info["member"] == member and info["turn"] == 1 and (terminated or truncated)
    mix.close()
    with pytest.raises(gym.error.ResetNeeded):
        step("hello")


def test_a_task_index_alone_names_the_same_member_task_whatever_the_seed():
    mix = gym.make("benchmax/Mix-v0", members=TWO)
    first = [mix.reset(seed=s, options={"task_index": i})[1]["task_id"] for s, i in zip(range(6), range(6))]
    again = [mix.reset(seed=100 + i, options={"task_index": i})[1]["task_id"] for i in range(6)]
    assert first == again and len(set(first)) == 6
    mix.close()


def test_stratified_sampling_keeps_every_window_of_256_within_two_points_of_the_weights():
    mix = gym.make("benchmax/Mix-v0", members=[*THREE, UNBUILDABLE]).unwrapped
    mix.reset(seed=7)
    draws = np.array([mix._sampler.draw(mix.np_random) for _ in range(3000)])
    weights = np.array([0.5, 0.3, 0.2, 0.0])
    for start in range(0, len(draws) - 256, 17):
        shares = np.bincount(draws[start:start + 256], minlength=4) / 256
        assert np.abs(shares - weights).max() <= 0.02, (start, shares)
    mix.close()


@pytest.mark.parametrize("sampling", ["stratified", "random"])
def test_the_sequence_of_members_and_tasks_is_reproducible_from_the_seed(sampling):
    def run():
        mix = gym.make("benchmax/Mix-v0", members=TWO, sampling=sampling)
        ids = [mix.reset(seed=3)[1]["task_id"]] + [mix.reset()[1]["task_id"] for _ in range(15)]
        mix.close()
        return ids

    first = run()
    assert first == run()
    assert {i.split("/")[0] for i in first} == {"Math-v0", "Wikipedia-v0"}


def test_random_sampling_follows_the_weights():
    mix = gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 0.8), ("benchmax/Wikipedia-v0", 0.2)],
                   sampling="random").unwrapped
    mix.reset(seed=0)
    draws = [mix._sampler.draw(mix.np_random) for _ in range(4000)]
    assert abs(np.mean(draws) - 0.2) < 0.03
    mix.close()


def test_members_are_built_only_when_drawn():
    mix = gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 1.0), UNBUILDABLE])
    for seed in range(30):
        _, info = mix.reset(seed=seed)
        assert info["member"] == "Math-v0"
    assert mix.unwrapped.built_members == ["Math-v0@0"]
    with pytest.raises(ValueError, match="dataset"):  # forced, it is built, and says why it cannot be
        mix.reset(options={"member": "Excel-SpreadsheetBench-v0"})
    mix.close()


def test_reward_components_and_records_are_namespaced_per_member():
    mix = gym.make("benchmax/Mix-v0", members=TWO)
    played = play(mix, mix.unwrapped.reference_solver(), options={"member": "Math-v0"})
    info = played.info
    assert info["member"] == "Math-v0" and played.terminated
    assert info["reward_components"] == {"Math-v0/correct": 1.0, "Math-v0/format": 1.0}
    assert info["mix_episode"]["success"] is True and info["outcome"] == "scored"
    record = mix.unwrapped.episode_record()
    assert record["member"] == "Math-v0" and record["task_id"] == info["task_id"]
    assert record["reward_components"] == info["reward_components"]
    mix.close()


def test_saved_state_continues_the_same_sequence_in_a_fresh_env():
    kwargs = {"members": [("benchmax/Math-v0", 0.6), ("benchmax/Wikipedia-v0", 0.4)],
              "curriculum": {"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2, 3], "window": 2,
                                         "start": 2}}}

    def episodes(env, n):  # wrong answers: the curriculum moves Math down as it goes
        out = []
        for _ in range(n):
            _, info = env.reset()
            env.step("\\boxed{wrong}")
            out.append((info["task_id"], info["difficulty"]))
        return out

    mix = gym.make("benchmax/Mix-v0", **kwargs)
    mix.reset(seed=11)
    episodes(mix, 3)
    state = mix.unwrapped.get_state()
    rest = episodes(mix, 12)
    assert {level for task, level in rest if task.startswith("Math")} >= {1, 0}  # it moved after the save
    resumed = gym.make("benchmax/Mix-v0", **kwargs)
    resumed.unwrapped.set_state(json.loads(json.dumps(state)))  # (as a checkpoint file keeps it)
    assert episodes(resumed, 12) == rest
    assert resumed.unwrapped.counts == mix.unwrapped.counts
    assert resumed.unwrapped.curriculum.stats() == mix.unwrapped.curriculum.stats()
    mix.close()
    resumed.close()


def test_bad_arguments_fail_at_make_naming_them():
    with pytest.raises(ValueError, match=r"members: 'benchmax/Maths-v0' is not a registered env id"):
        gym.make("benchmax/Mix-v0", members={"benchmax/Maths-v0": 1.0})
    with pytest.raises(ValueError, match=r"members: the weight of 'benchmax/Math-v0' must be a non-negative number"):
        gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": -1})
    with pytest.raises(ValueError, match=r"two members are named 'Math-v0'"):
        gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 1), (("benchmax/Math-v0", {"max_turns": 3}), 1)])
    with pytest.raises(TypeError, match=r"members: Math-v0: MathEnv got an unexpected keyword argument 'max_turnz' "
                                        r"\(did you mean 'max_turns'"):
        gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", {"max_turnz": 3}, 1.0)])
    with pytest.raises(ValueError, match=r"curriculum\['Math-v0'\]: a knob's path starts with \['task_arg'\]"):
        gym.make("benchmax/Mix-v0", curriculum={"Math-v0": {"knob": "task_arg.difficulty.digits", "values": [1, 2]}})
    with pytest.raises(ValueError, match=r"sampling must be one of"):
        gym.make("benchmax/Mix-v0", sampling="shuffled")
    with pytest.raises(ValueError, match=r"curriculum names members \['Excel-v0'\]"):
        gym.make("benchmax/Mix-v0", curriculum={"Excel-v0": "auto"})
    with pytest.raises(TypeError,
                       match=r"MixEnv got an unexpected keyword argument 'tool_fromat' \(did you mean 'tool_format'"):
        gym.make("benchmax/Mix-v0", tool_fromat="json")


def test_shared_options_reach_the_members_that_take_them_and_own_kwargs_win():
    mix = gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 1), ("benchmax/Wikipedia-v0", {"max_turns": 3}, 1)],
                   max_turns=5, python_tool=False)  # python_tool: Math's own option, not Wikipedia's
    mix.reset(options={"member": "Math-v0"})
    assert mix.unwrapped.max_turns == 5 and [t.name for t in mix.unwrapped.toolset] == ["calculator"]
    mix.reset(options={"member": "Wikipedia-v0"})
    assert mix.unwrapped.max_turns == 3
    mix.close()


def test_a_failed_episode_never_counts_toward_success():
    mix = gym.make("benchmax/Mix-v0", members=TWO, episode_timeout=1e-6,
                   curriculum={"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2], "window": 1}})
    for _ in range(3):
        mix.reset(options={"member": "Math-v0"})
        _, reward, _, truncated, info = mix.step("\\boxed{1}")
        assert info["outcome"] == "deadline" and math.isnan(reward) and truncated
        assert info["mix_episode"]["success"] is False
    members = mix.unwrapped.curriculum.members
    assert members["Math-v0"].episodes == 0 and members["Math-v0"].level == 0
    mix.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasiums_own_vector_modes_carry_the_member(mode):
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=3, vectorization_mode=mode, members=TWO)
    _, info = envs.reset(seed=0)
    assert set(info["member"]) <= {"Math-v0", "Wikipedia-v0"}
    _, _, terminated, _, info = envs.step(["done"] * 3)
    assert terminated.all() and info["_mix_episode"].all()
    envs.close()


def test_subprocess_workers_build_only_what_they_draw_and_report_members():
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=4, num_workers=2, members=[*TWO, UNBUILDABLE],
                        info_keys=["reward_components"])
    obs, info = envs.reset(seed=0)
    assert set(info["member"]) <= {"Math-v0", "Wikipedia-v0"}
    _, _, terminated, _, info = envs.step(["done"] * 4)
    assert terminated.all() and set(info) >= {"member", "reward_components", "mix_episode"}
    components = info["reward_components"]  # (batched: component -> array, "_component" -> which envs have it)
    for key in [k for k in components if not k.startswith("_")]:
        member = key.split("/")[0]
        assert member in ("Math-v0", "Wikipedia-v0")
        assert list(info["member"][components["_" + key]]) == [member] * int(components["_" + key].sum())
    built = [key.split("@")[0] for keys in envs.get_attr("built_members") for key in keys]
    assert set(built) <= {"Math-v0", "Wikipedia-v0"} and built
    # sampler state: saved per env and restored, the sequence goes on the same
    state = envs.get_mix_state()
    envs.step(["x"] * 4)  # (autoreset: the next episodes start)
    first = envs.step(["done"] * 4)[4]["mix_episode"]["task_id"]
    envs.set_mix_state(state)
    envs.step(["x"] * 4)
    assert list(envs.step(["done"] * 4)[4]["mix_episode"]["task_id"]) == list(first)
    envs.close()


def test_subprocess_workers_share_one_curriculum_through_the_parent():
    """Four workers, one env each, a window of 4 episodes: one batch of wrong answers is 4
    episodes in all, so the level drops for every worker at once (alone, each saw one)."""
    curriculum = {"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2, 3], "window": 4, "start": 2}}
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=4, num_workers=4, members=[("benchmax/Math-v0", 1.0)],
                        curriculum=curriculum)
    _, info = envs.reset(seed=0)
    assert list(info["difficulty"]) == [2, 2, 2, 2]
    _, _, terminated, _, info = envs.step(["\\boxed{not a number}"] * 4)
    assert terminated.all() and list(info["difficulty"]) == [2, 2, 2, 2]
    assert info["_success_rate"].all() and info["_zero_variance"].all()  # the parent's figures, per ended episode
    assert envs.curriculum_stats()["Math-v0"]["level"] == 1
    _, _, _, _, info = envs.step(["x"] * 4)  # autoreset: the next episodes, at the level the parent set
    assert list(info["difficulty"]) == [1, 1, 1, 1]
    assert envs.get_attr("curriculum")[0].follower
    envs.close()


def test_one_tool_set_for_all_episodes_is_refused_when_members_differ_and_given_when_they_share():
    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.serve import build_server

    with pytest.raises(ValueError,
                       match=r"different tools \(Math-v0: calculator.*; Wikipedia-v0: get_article, search\)"):
        trl_environment("benchmax/Mix-v0", members=TWO)
    with pytest.raises(ValueError, match=r"different tools"):
        build_server("benchmax/Mix-v0", {"members": TWO})
    levels = [(("easy", "benchmax/Math-v0", {"task_args": {"difficulty": {"digits": 1}}}), 1.0),
              (("hard", "benchmax/Math-v0", {"task_args": {"difficulty": {"digits": 5}}}), 1.0)]
    Env = trl_environment("benchmax/Mix-v0", members=levels, python_tool=False)
    instance = Env()
    assert callable(instance.calculator)
    instance.env.close()
    assert build_server("benchmax/Mix-v0", {"members": levels, "python_tool": False}) is not None


def test_eval_summarises_each_member_with_cis_and_zero_variance_per_difficulty():
    from benchmax_gym.eval import evaluate
    from benchmax_gym.eval.stats import format_summary

    result = evaluate("benchmax/Mix-v0", "solver", env_kwargs={"members": TWO, "python_tool": False},
                      tasks=6, k=2, concurrency=2)
    members = {r["member"] for r in result.records}
    assert members == {"Math-v0", "Wikipedia-v0"}
    assert len({r["task_id"] for r in result.records}) == 6  # namespaced: no two members' tasks merge
    by_member = result.summary["by_member"]
    for member in members:
        summary = by_member[member]
        assert summary["scored_episodes"] == sum(r["member"] == member for r in result.records)
        assert set(summary["success_rate"]) == {"value", "ci_low", "ci_high"}
        assert summary["zero_variance_by_difficulty"] == {"0": 1.0}  # the solver: every pair alike
    assert result.summary["zero_variance_groups"] == 1.0
    assert "member Math-v0" in format_summary(result.summary)


def test_a_restarted_worker_follows_the_parents_levels_and_its_lost_episode_does_not_count():
    import os
    import signal

    curriculum = {"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2, 3], "window": 4, "start": 2}}
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=4, num_workers=2, members=[("benchmax/Math-v0", 1.0)],
                        curriculum=curriculum)
    envs.reset(seed=0)
    envs.step(["\\boxed{not a number}"] * 4)  # 4 wrong answers: the level drops to 1
    envs.step(["x"] * 4)  # autoreset at level 1
    victim = envs.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    _, _, _, truncated, info = envs.step(["\\boxed{not a number}"] * 4)
    assert envs.worker_pids[1] != victim and list(info["outcome"][2:]) == ["env_error"] * 2
    # the two lost episodes are not the model's: only the other two count
    assert envs.curriculum_stats()["Math-v0"]["episodes"] == 6
    _, _, _, _, info = envs.step(["x"] * 4)  # every env starts anew, the restarted ones at the parent's level
    assert list(info["difficulty"]) == [1, 1, 1, 1]
    envs.close()


def test_a_named_mixture_registers_checks_at_once_and_runs_in_workers():
    from benchmax_gym import registry
    from benchmax_gym.mix import register_mix

    with pytest.raises(ValueError, match="members: 'benchmax/Nope-v0' is not a registered env id"):
        register_mix("testing/BadMix-v0", {"benchmax/Nope-v0": 1.0})
    assert "testing/BadMix-v0" not in gym.registry
    env_id = register_mix("testing/Mix-v0", TWO, python_tool=False)
    try:
        env = gym.make(env_id)
        _, info = env.reset(seed=0, options={"member": "Math-v0"})
        assert [t["function"]["name"] for t in info["tools"]] == ["calculator"]
        env.close()
        envs = gym.make_vec(env_id, num_envs=2, num_workers=2)
        _, info = envs.reset(seed=0)
        assert set(info["member"]) <= {"Math-v0", "Wikipedia-v0"}
        envs.close()
    finally:
        gym.registry.pop(env_id, None)
        registry.ENVS.pop(env_id, None)


def test_a_member_that_fails_to_build_raises_its_own_error_named_and_leaves_no_episode_to_step(tmp_path):
    """The failing member's reset raised, yet step() went on with the previous member's episode."""
    broken = ("broken", "benchmax/Math-v0", {"tasks": "hf", "task_args": {"dataset": str(tmp_path / "none.jsonl")}})
    mix = gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 1.0), (broken, 1.0)], disable_env_checker=True)
    failed = 0
    for seed in range(12):
        try:
            mix.reset(seed=seed)
        except FileNotFoundError as exc:
            failed += 1
            assert "none.jsonl" in str(exc)
            assert exc.__notes__ == ["mixture member 'broken' (benchmax/Math-v0 at level 0)"]
            with pytest.raises(gym.error.ResetNeeded):
                mix.step("\\boxed{1}")
        else:
            mix.step("<tool_call>{not json")  # a live episode of the good member, left playing
    assert 0 < failed < 12
    mix.close()


class _StepRaises(gym.Env):
    """A member whose step raises (its own bug), as a user's env might."""

    observation_space = action_space = benchmax_gym.UnicodeText(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "go", {"task_id": "0"}

    def step(self, action):
        raise RuntimeError("the member's own bug")


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_members_step_that_raises_names_the_member(asynchronous):
    """A reset that raised said which member failed; a step that raised did not."""
    gym.register("testing/StepRaises-v0", entry_point=_StepRaises, disable_env_checker=True)
    try:
        mix = gym.make("benchmax/Mix-v0", members={"testing/StepRaises-v0": 1.0}, disable_env_checker=True)
        mix.reset(seed=0)
        with pytest.raises(RuntimeError, match="the member's own bug") as raised:
            if asynchronous:
                asyncio.run(mix.unwrapped.astep("hi"))
            else:
                mix.step("hi")
        assert raised.value.__notes__ == ["mixture member 'StepRaises-v0'"]
        mix.close()
    finally:
        gym.registry.pop("testing/StepRaises-v0", None)


def test_weights_may_be_numpy_numbers_and_huge_ones_keep_their_ratio():
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": np.float32(0.25), "benchmax/Wikipedia-v0": np.int64(1)})
    assert mix.unwrapped.specs[0].weight == 0.25
    mix.close()
    # 1e308 + 1e308 overflows to inf: every draw went to the last member
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1e308, "benchmax/Wikipedia-v0": 1e308})
    assert mix.unwrapped._sampler.cumulative == [0.5]
    mix.close()


@pytest.mark.parametrize("sampling", ["stratified", "random"])
def test_draws_follow_the_weights_by_a_chi_square_test(sampling):
    """20,000 draws, fixed seed: the counts fit the weights (a zero weight is never drawn)."""
    from scipy.stats import chisquare

    from benchmax_gym.mix import MixSampler

    weights = [0.05, 0.0, 0.15, 0.3, 0.5]
    sampler, rng = MixSampler(weights, sampling), np.random.default_rng(1)
    sampler.seed(rng)
    counts = np.bincount([sampler.draw(rng) for _ in range(20_000)], minlength=len(weights))
    assert counts[1] == 0
    expected = np.array([w for w in weights if w]) * 20_000
    assert chisquare(counts[[0, 2, 3, 4]], expected).pvalue > 0.01, counts


def test_envs_reset_without_a_seed_do_not_all_play_the_same_member():
    """The stratified sequence's phase was 0 unless a seed was given: every env of a vector env
    reset without one played the same member at each reset, each batch all one member."""
    envs = gym.make_vec("benchmax/Mix-v0", num_envs=8, vectorization_mode="sync", members=TWO, python_tool=False)
    batches = [set(envs.reset()[1]["member"]) for _ in range(8)]
    assert any(len(b) == 2 for b in batches), batches
    envs.close()


def test_a_solved_episode_with_dense_rewards_is_a_success_and_moves_the_level_up():
    """Success is the graded reward at the rubric's maximum, as eval counts it: the per-turn
    'dense' leaf's weight was added to the maximum, so no episode succeeded and the level never rose."""
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1.0}, python_tool=False, dense_rewards=True,
                   curriculum={"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2], "window": 2}})
    solver = mix.unwrapped.reference_solver()
    played = [play(mix, solver, seed=0), play(mix, solver)]
    assert all(p.info["mix_episode"]["success"] for p in played)
    assert mix.unwrapped.curriculum.level("Math-v0") == 1
    mix.close()


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -0.5, "0.5", True, None])
def test_a_weight_that_is_no_non_negative_number_fails_at_make_naming_it(weight):
    with pytest.raises(ValueError, match=r"members: the weight of 'benchmax/Wikipedia-v0' must be a non-negative"):
        gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1.0, "benchmax/Wikipedia-v0": weight})


def test_weights_all_zero_fail_at_make():
    with pytest.raises(ValueError, match=r"members: at least one member needs a positive weight"):
        gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 0.0, "benchmax/Wikipedia-v0": 0})


@pytest.mark.parametrize("weights", [[0.7, 0.2, 0.1, 0.0], [1.0, 0.0, 0.0]])
def test_a_member_of_weight_zero_is_never_drawn_even_at_the_top_of_the_unit_interval(weights):
    """(Rounding left a trailing weight-0 member the sliver [0.9999999999999999, 1): drawn once in 2**53.)"""
    from benchmax_gym.mix import MixSampler

    for mode in ("stratified", "random"):
        sampler = MixSampler(weights, mode)
        sampler.offset = float(np.nextafter(1.0, 0.0))  # the stratified sequence's first point
        class Top:  # the random mode's draw, at its highest
            def random(self):
                return float(np.nextafter(1.0, 0.0))

        assert weights[sampler.draw(Top())] > 0
