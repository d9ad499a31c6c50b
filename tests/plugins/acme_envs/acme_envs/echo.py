"""acme/Echo-v0: repeat the word (the tool `shout` upper-cases it)."""

from benchmax_gym import ListTasks, Rubric, Task, ToolEnv, Toolset, tool

LOADED = True


@tool
def shout(word: str) -> str:
    """The word in capitals."""
    return word.upper()


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


class EchoEnv(ToolEnv):
    def __init__(self, **kwargs):
        tasks = ListTasks([Task(id=f"echo-{w}", prompt=f"Say {w} in capitals.", answer=w.upper())
                           for w in ("cat", "dog")])
        super().__init__(tasks=tasks, toolset=Toolset([shout]), rubric=Rubric([exact]), **kwargs)
