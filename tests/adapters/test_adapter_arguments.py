"""The adapters' helpers refuse a bad argument where they are called, naming it: a row count,
env arguments that are not a dict, OpenRLHF's chat options (checked by ChatTemplate's own rules
before the tokenizer comes, not at every sample)."""

import importlib

import pytest

from benchmax_gym.adapters import ChatTemplate, TemplateError, TokenSession
from benchmax_gym.adapters.openrlhf import make_executor
from benchmax_gym.adapters.tokens import make_env, task_dataset

ENV = "benchmax/Math-v0"
FAST = {"python_tool": False}


def _rows(adapter):
    if adapter == "tokens":
        return lambda n: task_dataset(ENV, n, env_kwargs=FAST)
    module = importlib.import_module(f"benchmax_gym.adapters.{adapter}")
    return lambda n: module.task_rows(ENV, n, **FAST)


@pytest.mark.parametrize("adapter", ["tokens", "openrlhf", "verl", "skyrl"])
def test_task_rows_refuse_a_count_that_is_not_a_positive_int(adapter):
    """0 or -1 gave an empty dataset (a trainer then started on nothing); "3" or 2.5 a bare
    TypeError from range; True one row."""
    rows = _rows(adapter)
    for n in (0, -1, "3", 2.5, True):
        with pytest.raises(ValueError, match=f"^n must be a positive int, got {n!r}$"):
            rows(n)
    assert len(rows(2)) == 2


def test_task_dataset_of_an_endless_generated_source_has_a_thousand_rows_by_default():
    """n=None is every task of a sized source, 1,000 of a generated one (its length is 2**62:
    it built rows until memory ran out)."""
    rows = task_dataset(ENV, env_kwargs=FAST)
    assert len(rows) == 1000 and rows["task_index"][-1] == 999


@pytest.mark.parametrize("kwargs", [["max_turns", 3], "max_turns=3", 5])
def test_env_kwargs_that_are_not_a_dict_are_refused_naming_them(kwargs):
    """They raised "make() argument after ** must be a mapping", naming nothing."""
    says = f"^env_kwargs must be a dict, got {kwargs!r}"
    for call in (lambda: task_dataset(ENV, 1, env_kwargs=kwargs), lambda: make_env(ENV, kwargs),
                 lambda: TokenSession(ENV, object(), env_kwargs=kwargs)):
        with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
            call()


@pytest.mark.parametrize("chat_kwargs, says", [
    ({"tool_role": "assistant"}, "chat_kwargs: tool_role must be 'tool' or 'user', got 'assistant'"),
    ({"chat_template": 5}, "chat_kwargs: chat_template must be a Jinja chat template string or None, got 5"),
    ({"tools": 5}, "chat_kwargs: tools must be a list of tool schemas (dicts) or None, got 5"),
    ({"tools": ["add"]}, "chat_kwargs: tools must be a list of tool schemas (dicts) or None, got ['add']"),
    ({"add_generation_prompt": True},
     "chat_kwargs: template variables may not be named ['add_generation_prompt']: the template is rendered with them"),
])
def test_openrlhf_refuses_bad_chat_options_when_the_executor_is_made(qwen_tokenizer, chat_kwargs, says):
    """Refused by make_executor (when OpenRLHF loads the agent file), as ChatTemplate refuses
    them (it is built only at the first sample): each sample raised TemplateError or TypeError."""
    with pytest.raises(TemplateError) as raised:
        make_executor(ENV, chat_kwargs=chat_kwargs, **FAST)
    assert str(raised.value) == says
    with pytest.raises(TemplateError) as direct:
        ChatTemplate(qwen_tokenizer, **chat_kwargs)
    assert str(direct.value) == says.removeprefix("chat_kwargs: ")


@pytest.mark.parametrize("chat_kwargs", [5, "tool_role=user", [("tool_role", "user")]])
def test_openrlhf_refuses_chat_kwargs_that_are_not_a_dict(chat_kwargs):
    with pytest.raises(ValueError, match="^chat_kwargs must be a dict of ChatTemplate options"):
        make_executor(ENV, chat_kwargs=chat_kwargs, **FAST)


def test_openrlhf_takes_good_chat_options_and_template_variables(qwen_tokenizer):
    chat_kwargs = {"tool_role": "user", "enable_thinking": False, "tools": [{"type": "function"}]}
    assert make_executor(ENV, chat_kwargs=chat_kwargs, **FAST)
    assert ChatTemplate(qwen_tokenizer, **chat_kwargs).template_kwargs == {"enable_thinking": False}


def test_trl_and_verl_refuse_env_kwargs_that_are_not_a_dict_and_trl_bad_chat_options():
    """TRL's rollout and verl's agent loop took a list of pairs as a dict (``dict(...)``), and
    TRL's ``chat_kwargs=5`` raised a bare "argument after ** must be a mapping"."""
    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.adapters.verl import BenchmaxAgentLoop
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    pairs = [("max_turns", 3)]
    with pytest.raises(ValueError, match=r"^env_kwargs must be a dict, got \[\('max_turns', 3\)\]$"):
        TRLRollout(ENV, tiny_tokenizer("qwen"), env_kwargs=pairs)
    with pytest.raises(ValueError, match=r"^env_kwargs must be a dict, got \[\('max_turns', 3\)\]$"):
        BenchmaxAgentLoop(env_id=ENV, env_kwargs=pairs)
    with pytest.raises(ValueError, match="^chat_kwargs must be a dict of ChatTemplate options"):
        TRLRollout(ENV, tiny_tokenizer("qwen"), env_kwargs=FAST, chat_kwargs=5)
    with pytest.raises(TemplateError, match="^chat_kwargs: tool_role must be 'tool' or 'user', got 'assistant'$"):
        TRLRollout(ENV, tiny_tokenizer("qwen"), env_kwargs=FAST, chat_kwargs={"tool_role": "assistant"})
