"""A mixture closes the levels its curriculum left: each level played held what its episodes
started (MCP-v0's server: a process, 6 fds, 2 threads) until the mixture closed, one more per
level reached. Closed at the next reset, a level played again is made again, its RNG where it was."""

import gymnasium as gym
import psutil

import benchmax_gym  # noqa: F401

MATH_LEVELS = {"Math-v0": {"knob": "task_args.difficulty.digits", "values": [1, 2]}}


def servers() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def test_a_level_the_curriculum_left_is_closed_at_the_next_reset_with_the_server_it_started():
    before = servers()
    env = gym.make("benchmax/Mix-v0", members=[("benchmax/MCP-v0", 1.0), ("benchmax/Math-v0", 1.0)],
                   curriculum={"MCP-v0": {"knob": "max_turns", "values": [4, 8]}}, python_tool=False)
    try:
        env.reset(seed=0, options={"member": "MCP-v0"})
        started = servers() - before
        assert started, "MCP-v0's server starts at a reset"
        env.unwrapped.set_curriculum_levels({"MCP-v0": 1})  # (as a vector env's parent moves it)
        env.reset(options={"member": "Math-v0"})
        assert env.unwrapped.built_members == ["Math-v0@0"]  # MCP-v0@1: made when first drawn
        _, alive = psutil.wait_procs([psutil.Process(pid) for pid in started if psutil.pid_exists(pid)], timeout=60)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]  # level 0's server: ended
    finally:
        env.close()


def forced(env, level, seed=None):
    _, info = env.reset(seed=seed, options={"member": "Math-v0", "difficulty": level})
    return info["task_id"]


def test_a_closed_level_played_again_continues_its_tasks_and_a_seed_restarts_them():
    def mix():
        return gym.make("benchmax/Mix-v0", members=[("benchmax/Math-v0", 1.0)], curriculum=MATH_LEVELS,
                        python_tool=False)

    kept, released = mix(), mix()
    try:
        assert forced(kept, 0, seed=5) == forced(released, 0, seed=5)
        forced(kept, 1)
        released.unwrapped.set_curriculum_levels({"Math-v0": 1})
        forced(released, 1)
        assert released.unwrapped.built_members == ["Math-v0@1"]  # level 0: closed
        assert [forced(released, 0) for _ in range(2)] == [forced(kept, 0) for _ in range(2)]
        released.unwrapped.set_curriculum_levels({"Math-v0": 0})
        forced(released, 0)  # (level 1 closed now)
        fresh = mix()
        try:
            assert [forced(released, 1, seed=9), forced(released, 1)] == [forced(fresh, 1, seed=9), forced(fresh, 1)]
        finally:
            fresh.close()
    finally:
        kept.close()
        released.close()
