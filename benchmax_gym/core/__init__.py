"""The one engine every benchmax-gym environment runs on."""

from benchmax_gym.core.env import Episode, ToolEnv
from benchmax_gym.core.group import GroupRubric
from benchmax_gym.core.judge import JudgeRubric
from benchmax_gym.core.outcomes import RewardFailure
from benchmax_gym.core.formats import FORMATS, Parsed, ToolCall, ToolCallFormat, get_format
from benchmax_gym.core.rubric import RewardFn, Rubric, all_of, final_answer, gate, milestones, min_of, product
from benchmax_gym.core.spaces import UnicodeText
from benchmax_gym.core.tasks import DatasetTasks, GeneratedTasks, ListTasks, Task, TaskSource, load_records
from benchmax_gym.core.tools import Tool, ToolError, ToolFailure, ToolResult, Toolset, tool

__all__ = [
    "DatasetTasks", "Episode", "FORMATS", "GeneratedTasks", "GroupRubric", "JudgeRubric", "ListTasks", "Parsed", "RewardFailure", "RewardFn", "Rubric",
    "Task", "TaskSource", "Tool", "ToolCall", "ToolCallFormat", "ToolEnv", "ToolError", "ToolFailure", "ToolResult",
    "Toolset", "UnicodeText", "all_of", "final_answer", "gate", "get_format", "load_records", "milestones", "min_of",
    "product", "tool",
]
