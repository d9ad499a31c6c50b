"""Environments built every way a user builds one, registered on import: by the tests, by vector
workers and by the CLI (``benchmax-gym --import tests.matrix_envs ...``)."""

import sys

import gymnasium as gym

from benchmax_gym import BaseEnv, ToolDefinition, final_answer, register_benchmax_env, register_tool_env, tool
from benchmax_gym.registry import VectorFactory

CITY = {"Lima": "Peru", "Paris": "France"}


def country(city: str) -> str:
    """Look up a city's country.

    Args:
        city: the city's English name
    """
    return CITY.get(city, "unknown")


def stated(completion: str, answer: str) -> float:
    return float((final_answer(completion) or "").casefold() == answer.casefold())


def open_desk(task, episode):
    """Per-episode state: what this episode looked up and submitted (issue 31's setup)."""
    return {"looked_up": [], "submitted": None}


def close_desk(state):
    state["closed"] = True


def locate(city: str, state) -> str:
    """Look up a city's country.

    Args:
        city: the city's English name
    """
    state["looked_up"].append(city)
    return CITY.get(city, "unknown")


@tool(terminal=True)
def submit(country: str, state) -> str:
    """Submit the country: this ends the session.

    Args:
        country: the country's English name
    """
    state["submitted"] = country
    return "submitted"


def submitted(state, answer: str) -> float:
    return float((state["submitted"] or "").casefold() == answer.casefold())


class Notes(BaseEnv):
    """A benchmax environment: a note per rollout, graded on the answer."""

    system_prompt = "Save the number with write_note, then answer it inside <answer></answer>."

    def __init__(self, **kwargs):
        self.notes: dict[str, str] = {}

    async def list_tools(self):
        return [ToolDefinition("write_note", "Save a note.", {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})]

    async def init_rollout(self, rollout_id, **rollout_args):
        self.notes[rollout_id] = ""

    async def release_rollout(self, rollout_id):
        self.notes.pop(rollout_id, None)

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        self.notes[rollout_id] = tool_args["text"]
        return "saved"

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        return {"correct": float(final_answer(completion) == ground_truth)}


def traveller(conversation, task):
    """A simulated user (issue 31): names their city when asked a question, else is done."""
    if conversation[-1]["content"].rstrip().endswith("?"):
        return f"I am in {task.private['user']['city']}."
    return None


if "matrix/Geo-v0" not in gym.registry:
    register_tool_env("matrix/Geo-v0", tools=[country], rubric=[stated], system_prompt="Answer with the tools.",
                      tasks=[{"prompt": "Which country is Lima in?", "answer": "Peru"}], max_turns=4)
    register_tool_env("matrix/Desk-v0", tools=[locate, submit], rubric=[submitted], setup=open_desk,
                      teardown=close_desk, system_prompt="Look the city up, then submit its country.",
                      tasks=[{"prompt": "Which country is Lima in?", "answer": "Peru"}], max_turns=4)
    register_tool_env("matrix/Helpdesk-v0", tools=[country], rubric=[stated], user=traveller, max_turns=6,
                      system_prompt="Help the traveller; put the country in <answer></answer>.",
                      tasks=[{"prompt": "Which country am I in?", "answer": "Peru", "user": {"city": "Lima"}}])
    register_benchmax_env("matrix/Notes-v0", Notes, [{"prompt": "Remember 42.", "ground_truth": "42"}])
    gym.register("matrix/MCPConfig-v0", entry_point="benchmax_gym.envs.mcp.env:MCPEnv",
                 vector_entry_point=VectorFactory("matrix/MCPConfig-v0"), kwargs={
        "server": {"command": sys.executable, "args": ["-m", "benchmax_gym.envs.mcp.example_server"]},
        "tasks": [{"prompt": "What is 6 * 7? Use calculate.", "answer": "42"}],
        "reward": stated,
    })

if "matrix/Mix-v0" not in gym.registry:  # a mixture (benchmax/Mix-v0) of two members that share their tools
    from benchmax_gym.mix import register_mix

    register_mix("matrix/Mix-v0", [(("geo", "matrix/Geo-v0", {}), 0.5), (("geo-short", "matrix/Geo-v0",
                                                                           {"max_turns": 3}), 0.5)])

# id -> (kwargs, a tool call, what its result shows, the right final reply, its reward)
CASES = {
    "benchmax/Math-v0": ({"python_tool": False},
                         '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>', "42",
                         None, 1.0),  # None: the task's own answer, boxed
    "matrix/Geo-v0": ({}, '<tool_call>{"name": "country", "arguments": {"city": "Lima"}}</tool_call>', "Peru",
                      "<answer>Peru</answer>", 1.0),
    "matrix/Desk-v0": ({}, '<tool_call>{"name": "locate", "arguments": {"city": "Lima"}}</tool_call>', "Peru",
                       '<tool_call>{"name": "submit", "arguments": {"country": "Peru"}}</tool_call>', 1.0),
    "matrix/Helpdesk-v0": ({}, '<tool_call>{"name": "country", "arguments": {"city": "Lima"}}</tool_call>', "Peru",
                       "<answer>Peru</answer>", 1.0),
    "matrix/Notes-v0": ({}, '<tool_call>{"name": "write_note", "arguments": {"text": "42"}}</tool_call>', "saved",
                        "<answer>42</answer>", 1.0),
    "matrix/Mix-v0": ({}, '<tool_call>{"name": "country", "arguments": {"city": "Lima"}}</tool_call>', "Peru",
                      "<answer>Peru</answer>", 1.0),
    "matrix/MCPConfig-v0": ({}, '<tool_call>{"name": "calculate", "arguments": {"expression": "6 * 7"}}</tool_call>',
                            "42", "<answer>42</answer>", 1.0),
}


def final_reply(env_id: str, kwargs: dict) -> str:
    """The right final reply for task 0 of ``env_id``."""
    _, _, _, final, _ = CASES[env_id]
    if final is not None:
        return final
    env = gym.make(env_id, **kwargs)
    answer = env.unwrapped.tasks[0].answer
    env.close()
    return f"\\boxed{{{answer}}}"
