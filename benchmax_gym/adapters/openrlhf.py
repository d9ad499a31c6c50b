"""OpenRLHF: any benchmax-gym env as an agent for ``--agent_func_path`` (``pip install 'benchmax-gym[openrlhf]'``).

OpenRLHF loads a Python file and instantiates its ``AgentExecutor`` class. Point it at a file
of two lines (``examples/openrlhf_agent.py``)::

    from benchmax_gym.adapters.openrlhf import make_executor
    AgentExecutor = make_executor("benchmax/Math-v0", max_turns=4)

or at this module itself, configured by ``BENCHMAX_ENV_ID`` and ``BENCHMAX_ENV_KWARGS`` (JSON).
Each prompt gets its own env; the row's ``label`` is its task index (rows from
:func:`task_rows`). OpenRLHF's own ``MultiTurnAgentExecutor`` runs the loop: it keeps the model's
token ids as generated and tokenises the environment's feedback on its own, which this adapter
renders with the chat template (the rest of the assistant's turn end, the tool results, the next
generation prompt), so the concatenation is what the template renders for the conversation.
The env's reward components go to ``extra_logs``, which OpenRLHF logs.
"""

from __future__ import annotations

import json
import os
from typing import Any

from benchmax_gym.adapters.tokens import ChatTemplate, make_env, task_dataset

try:
    import torch
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor
except ImportError:  # pragma: no cover - exercised by the missing-extra test in a bare venv
    raise ImportError("the OpenRLHF adapter needs openrlhf: pip install 'benchmax-gym[openrlhf]'") from None


class _Generations:
    """The engine, seen by one prompt's agent: it remembers the model's last token ids, which
    OpenRLHF does not pass to ``step`` (whether the reply ended with a stop token decides how
    its turn is closed)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.last_ids: list[int] = []

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        output = await self.engine.generate(*args, **kwargs)
        self.last_ids = list(output.outputs[0].token_ids)
        return output


class BenchmaxAgentInstance(AgentInstanceBase):
    """One benchmax-gym episode behind OpenRLHF's ``reset(states)`` / ``step(states)``."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], chat: ChatTemplate, generations: _Generations):
        self.env = make_env(env_id, env_kwargs)
        self.chat = chat
        self.generations = generations

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        label = states.get("label")
        options = {"task_index": int(label)} if label not in (None, "") else None
        self.env.reset(options=options)
        return {"observation": self.chat.render(self.env.unwrapped.chat_messages("hf"), add_generation_prompt=True)}

    async def step(self, states: dict, **kwargs: Any) -> dict:
        _, reward, terminated, truncated, info = self.env.step(states["action_text"])
        done = terminated or truncated
        if done:
            feedback = ""
            logs = {f"reward/{k}": float(v) for k, v in info.get("reward_components", {}).items()}
            logs["tool_errors"] = float(self.env.unwrapped.episode_record().get("tool_errors", 0))
            self.env.close()
        else:
            feedback = self.chat.env_text(info["messages"], self.generations.last_ids)
            logs = {}
        return {"rewards": torch.tensor(float(reward)), "scores": torch.tensor(float(reward)),
                "environment_feedback": feedback, "done": done, "sampling_params": states.get("sampling_params"),
                "extra_logs": logs}


def make_executor(env_id: str, *, chat_kwargs: dict[str, Any] | None = None, **env_kwargs: Any) -> type:
    """An ``AgentExecutor`` class (no-argument constructor, as OpenRLHF makes it) for ``env_id``."""
    make_env(env_id, env_kwargs).close()  # a wrong id or argument fails when OpenRLHF loads the file

    class AgentExecutor(MultiTurnAgentExecutor):
        __doc__ = f"OpenRLHF's multi-turn executor over {env_id} (benchmax-gym)."

        def __init__(self):
            super().__init__(BenchmaxAgentInstance)
            self._chat: ChatTemplate | None = None

        async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
            if self._chat is None or self._chat.tokenizer is not hf_tokenizer:
                self._chat = ChatTemplate(hf_tokenizer, **(chat_kwargs or {}))
            generations = _Generations(llm_engine)
            # the parent builds its instance first thing, before any await: no other prompt interleaves
            self.agent_instance_cls = lambda: BenchmaxAgentInstance(env_id, env_kwargs, self._chat, generations)
            return await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer, generations, images)

    return AgentExecutor


def task_rows(env_id: str, n: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
    """Rows for OpenRLHF's prompt dataset: ``prompt`` (the env's messages; the agent renders its
    own) and ``label`` (the task index), for ``--input_key prompt --label_key label``."""
    rows = task_dataset(env_id, n, env_kwargs=env_kwargs).to_list()
    return [{"prompt": r["prompt"], "label": str(r["task_index"])} for r in rows]


if os.environ.get("BENCHMAX_ENV_ID"):  # loaded by path as an agent file
    AgentExecutor = make_executor(os.environ["BENCHMAX_ENV_ID"], **json.loads(os.environ.get("BENCHMAX_ENV_KWARGS", "{}")))
