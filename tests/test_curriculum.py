"""The curriculum controller: levels move to keep success in the band, failures never count,
fixed schedules, zero-variance groups, state round trips; and the family levels really build."""

import math

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.curriculum import FAMILY_LEVELS, Curriculum, MemberLevels, apply_level, member_levels


def controller(**options):
    return Curriculum({"m": MemberLevels("m", [{"k": 1}, {"k": 2}, {"k": 3}], **options)}, group_size=2)


def test_the_level_rises_above_the_band_falls_below_it_and_restarts_its_window():
    c = controller(window=4, band=(0.3, 0.7))
    for i in range(4):
        c.record("m", 0, f"t{i}", 1.0, True, "scored")
    assert c.level("m") == 1 and math.isnan(c.members["m"].success_rate())
    for i in range(3):  # 3 of 4 wrong: 0.25 < 0.3, but only once the window has 4
        assert c.level("m") == 1
        c.record("m", 1, f"u{i}", 0.0, False, "scored")
    c.record("m", 1, "u3", 1.0, True, "scored")
    assert c.level("m") == 0
    for i in range(4):  # inside the band: it stays
        c.record("m", 0, f"v{i}", float(i % 2), bool(i % 2), "scored")
    assert c.level("m") == 0


def test_failures_and_episodes_begun_at_an_old_level_do_not_count():
    c = controller(window=2)
    for i in range(5):
        assert not c.record("m", 0, "t", math.nan, False, "env_error")
        c.record("m", 0, "t", 0.0, False, "tool_timeout")
    assert c.members["m"].episodes == 0 and c.groups == {}
    c.members["m"].level = 1
    c.record("m", 0, "t", 1.0, True, "scored")
    c.record("m", 0, "t", 1.0, True, "scored")
    assert c.level("m") == 1  # (they were played at level 0)


def test_a_fixed_schedule_sets_the_level_from_episodes_seen():
    c = controller(schedule=[(0, 0), (3, 1), (5, 2)])
    levels = []
    for i in range(6):
        c.record("m", c.level("m"), i, 0.0, False, "scored")
        levels.append(c.level("m"))
    assert levels == [0, 0, 1, 1, 2, 2]
    by_function = controller(schedule=lambda episodes: episodes // 2)
    for i in range(9):
        by_function.record("m", by_function.level("m"), i, 1.0, True, "scored")
    assert by_function.level("m") == 2  # clipped to the last level



@pytest.mark.parametrize("returned", [None, "2", float("nan")])
def test_a_schedule_function_that_returns_no_level_says_so(returned):
    """(int(None) raised a bare TypeError in the step that ended the episode.) At 0 episodes it is
    asked at make (the first level played); later, in the step that ends an episode."""
    with pytest.raises(TypeError, match=r"curriculum\['m'\]\['schedule'\]\(0\) must return a level \(a number\)"):
        controller(schedule=lambda episodes: returned)
    c = controller(schedule=lambda episodes: 0 if episodes == 0 else returned)
    with pytest.raises(TypeError, match=r"curriculum\['m'\]\['schedule'\]\(1\) must return a level \(a number\)"):
        c.record("m", 0, "t", 1.0, True, "scored")

def test_zero_variance_groups_are_counted_per_member_and_level():
    c = controller(window=100)
    for task, rewards in {"a": (1.0, 1.0), "b": (0.0, 1.0), "c": (0.0, 0.0), "d": (1.0,)}.items():
        for r in rewards:
            c.record("m", 0, task, r, r == 1.0, "scored")
    assert c.zero_variance("m", 0) == pytest.approx(2 / 3)
    assert math.isnan(c.zero_variance("m", 1))
    stats = c.stats()["m"]
    assert stats["groups"] == {0: 3} and stats["zero_variance"] == {0: pytest.approx(2 / 3)}


def test_state_round_trips():
    c = controller(window=3)
    for i in range(5):
        c.record("m", c.level("m"), i % 2, 1.0, True, "scored")
    other = controller(window=3)
    other.load_state_dict(c.state_dict())
    assert other.stats() == c.stats() and other.open == c.open


def test_a_follower_records_statistics_but_never_moves_levels():
    c = controller(window=1)
    c.set_levels({"m": 2})
    for i in range(3):
        c.record("m", 2, "t", 1.0, True, "scored")
    assert c.level("m") == 2 and c.follower


def test_bad_curriculum_specs_name_the_member_and_key():
    with pytest.raises(ValueError, match=r"curriculum\['m'\]\['band'\]"):
        member_levels("m", "benchmax/Math-v0", {"band": (0.8, 0.2)}, {})
    with pytest.raises(ValueError, match=r"curriculum\['m'\]: benchmax/MCP-v0 declares no difficulty levels"):
        member_levels("m", "benchmax/MCP-v0", "auto", {})
    with pytest.raises(ValueError, match=r"unexpected keys \['knobs'\]"):
        member_levels("m", "benchmax/Math-v0", {"knobs": 1}, {})
    with pytest.raises(ValueError, match=r"group_size must be an int of at least 2"):
        gym.make("benchmax/Mix-v0", group_size=1)


@pytest.mark.parametrize("env_id", sorted(FAMILY_LEVELS))
def test_every_declared_family_level_makes_its_env(env_id):
    easiest, hardest = FAMILY_LEVELS[env_id][0], FAMILY_LEVELS[env_id][-1]
    for overlay in (easiest, hardest):
        env = gym.make(env_id, **apply_level({}, overlay))
        env.reset(seed=0)
        env.close()


def test_math_digits_really_change_the_tasks():
    mix = gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1.0}, curriculum={"Math-v0": "auto"})
    _, easy = mix.reset(seed=0)
    mix.unwrapped.curriculum.members["Math-v0"].level = 5
    _, hard = mix.reset()
    assert easy["difficulty"] == 0 and hard["difficulty"] == 5
    assert mix.unwrapped.built_members == ["Math-v0@5"]  # (level 0, left: closed)
    mix.close()


@pytest.mark.parametrize("options, says", [
    # more than the window holds: the level could never move (the member stuck at its start for good)
    ({"window": 8, "min_episodes": 9}, r"\['min_episodes'\] must be an int from 1 to the window \(8\), got 9"),
    ({"min_episodes": "8"}, r"\['min_episodes'\] must be an int"),
    ({"min_episodes": 0}, r"\['min_episodes'\] must be an int"),
    ({"start": "1"}, r"\['start'\] must be a level from 0 to 5, got '1'"),
    ({"start": True}, r"\['start'\] must be a level from 0 to 5, got True"),
    ({"schedule": [10, 2]}, r"\['schedule'\]: each entry must be \(episodes >= 0, level from 0 to 5\), got 10"),
    ({"schedule": [(0, 1.5)]}, r"\['schedule'\]: each entry must be"),
    ({"schedule": "0:1"}, r"\['schedule'\] must be a non-empty list of \(episodes, level\) pairs or a function"),
    ({"schedule": {0: 1}}, r"\['schedule'\] must be a non-empty list"),
])
def test_bad_level_options_fail_at_make_naming_the_member_and_key(options, says):
    with pytest.raises(ValueError, match=r"curriculum\['Math-v0'\]" + says):
        gym.make("benchmax/Mix-v0", members={"benchmax/Math-v0": 1.0}, curriculum={"Math-v0": options})


def test_min_episodes_up_to_the_window_moves_the_level():
    c = controller(window=4, min_episodes=4)
    for i in range(4):
        c.record("m", 0, f"t{i}", 1.0, True, "scored")
    assert c.level("m") == 1


def test_a_saved_level_this_member_does_not_have_is_refused_on_load():
    c = controller()
    state = c.state_dict()
    state["members"]["m"]["level"] = 7  # saved with more levels than this run declares
    with pytest.raises(ValueError, match=r"curriculum\['m'\]: the saved level 7 is not one of this member's levels 0..2"):
        controller().load_state_dict(state)
