"""Trainer adapters: token-exact episodes (:mod:`.tokens`) and one adapter per trainer.

The trainers are optional extras; each adapter module imports its trainer lazily and names the
``pip install`` to run when it is missing:

* :mod:`.trl`: ``rollout_func`` and ``environment_factory`` for TRL's ``GRPOTrainer``;
* :mod:`.skyrl`: a ``skyrl_gym`` ``BaseTextEnv`` registered as ``benchmax``;
* :mod:`.openrlhf`: an ``AgentExecutor`` for ``--train.agent_func_path``;
* :mod:`.verl`: an ``AgentLoopBase`` registered as ``benchmax``.
"""

from benchmax_gym.adapters.tokens import (
    ChatTemplate,
    TemplateError,
    TokenEpisode,
    TokenSession,
    make_env,
)

__all__ = ["ChatTemplate", "TemplateError", "TokenEpisode", "TokenSession", "make_env"]
