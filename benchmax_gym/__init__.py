"""benchmax-gym: multi-turn, tool-using text environments with the Gymnasium API.

Importing the package registers every ``benchmax/*`` id with Gymnasium::

    import gymnasium as gym
    import benchmax_gym

    env = gym.make("benchmax/Math-v0")
"""

from benchmax_gym.core import (
    DatasetTasks,
    Episode,
    GeneratedTasks,
    ListTasks,
    RewardFn,
    Rubric,
    Task,
    TaskSource,
    Tool,
    ToolEnv,
    ToolError,
    Toolset,
    UnicodeText,
    tool,
)
from benchmax_gym.core.benchmax import BaseEnv, BenchmaxEnv, ToolDefinition, extract_completion_text, register_benchmax_env
from benchmax_gym.core.rubric import final_answer
from benchmax_gym.registry import register_envs, register_tool_env

__version__ = "0.1.0"

register_envs()

__all__ = [
    "BaseEnv", "BenchmaxEnv", "DatasetTasks", "Episode", "GeneratedTasks", "ListTasks", "RewardFn", "Rubric",
    "Task", "TaskSource", "Tool", "ToolDefinition", "ToolEnv", "ToolError", "Toolset", "UnicodeText",
    "extract_completion_text", "final_answer", "register_benchmax_env", "register_envs", "register_tool_env", "tool",
]
