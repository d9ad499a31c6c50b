"""A real Hugging Face tokenizer and model built locally, for tests and CPU smoke runs of the
trainer adapters (no Hub download: a byte-level BPE trained on the fly, a random tiny model).

Three chat templates in the styles adapters meet: ``qwen`` (ChatML, tool results grouped in a
user turn as ``<tool_response>``), ``llama3`` (header tokens, ``ipython`` tool turns, trimmed
content) and ``plain`` (role lines, EOS at each turn end), written here in those styles; and the
real ``qwen2.5``, ``qwen3`` and ``llama3.1`` templates, read from the copies TRL ships
(``trl/chat_templates``; TRL recognises them and knows how to parse their tool calls).
"""

from __future__ import annotations

import functools
from typing import Any

QWEN_TEMPLATE = (
    "{%- if messages[0].role == 'system' or tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    "{%- if tools %}{{- '\\n\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall a function with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.' }}"
    "{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}{%- set call = call.function or call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + (call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools:' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + (message.content | trim) + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

PLAIN_TEMPLATE = (
    "{%- for message in messages %}{{- '### ' + message.role + '\\n' + message.content + eos_token + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '### assistant\\n' }}{%- endif %}"
)

TEMPLATES = {"qwen": QWEN_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "plain": PLAIN_TEMPLATE}
REAL_TEMPLATES = {"qwen2.5": "qwen2_5.jinja", "qwen3": "qwen3.jinja", "llama3.1": "llama3_1.jinja"}
_QWEN = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "additional": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]}
_SPECIAL = {
    "qwen2.5": _QWEN, "qwen3": _QWEN,
    "llama3.1": {"eos_token": "<|eot_id|>", "pad_token": "<|finetune_right_pad_id|>", "bos_token": "<|begin_of_text|>",
                 "additional": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"]},
    "qwen": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
             "additional": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]},
    "llama3": {"eos_token": "<|eot_id|>", "pad_token": "<|finetune_right_pad_id|>", "bos_token": "<|begin_of_text|>",
               "additional": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                              "<|finetune_right_pad_id|>"]},
    "plain": {"eos_token": "</s>", "pad_token": "<pad>", "additional": ["</s>", "<pad>"]},
}


def _corpus() -> list[str]:
    """Text like what the envs say: their prompts, tools and the solver's replies."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401
    from benchmax_gym.testing import play

    lines = ["The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) { } [ ] < > \" ' : , ."]
    for env_id in ("benchmax/Math-v0", "benchmax/CRM-v0", "benchmax/Wikipedia-v0"):
        env = gym.make(env_id)
        try:
            for seed in range(3):
                played = play(env, seed=seed)
                lines += [m.get("content") or "" for m in env.unwrapped.messages]
                lines += played.observations
        finally:
            env.close()
    return lines


@functools.cache
def _trained(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus() * 2, trainer)
    return tok.to_str()


def tiny_tokenizer(style: str = "qwen", vocab_size: int = 1024) -> Any:
    """A ``PreTrainedTokenizerFast`` (byte-level BPE trained here) with the ``style`` chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if style not in TEMPLATES and style not in REAL_TEMPLATES:
        raise ValueError(f"style must be one of {sorted(TEMPLATES) + sorted(REAL_TEMPLATES)}, got {style!r}")
    special = _SPECIAL[style]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_trained(vocab_size)))
    tokenizer.add_special_tokens({"additional_special_tokens": special["additional"]})
    tokenizer.eos_token = special["eos_token"]
    tokenizer.pad_token = special["pad_token"]
    if "bos_token" in special:
        tokenizer.bos_token = special["bos_token"]
    tokenizer.chat_template = TEMPLATES[style] if style in TEMPLATES else _real_template(style)
    tokenizer.padding_side = "left"
    return tokenizer


def _real_template(style: str) -> str:
    from importlib.resources import files

    return (files("trl") / "chat_templates" / REAL_TEMPLATES[style]).read_text(encoding="utf-8")


def tiny_model(tokenizer: Any, *, hidden_size: int = 32, layers: int = 2, seed: int = 0) -> Any:
    """A randomly initialised Qwen2 causal LM sized for ``tokenizer`` (CPU, a few hundred KB)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


# -- checking token episodes ---------------------------------------------------------------------


def model_ids(chat: Any, text: str, stop: bool = True) -> list[int]:
    """The ids a model would sample for ``text``, ending with its stop token."""
    return chat.encode(text) + ([chat.tokenizer.eos_token_id] if stop else [])


def whole_conversation(session: Any) -> list[int]:
    """What the template renders for the whole conversation, the assistant turns holding the
    model's text, up to the end of its last turn."""
    env = session.env.unwrapped
    actions = iter(env.episode_record()["actions"])
    opening = len(env.task_messages(env.episode.task))  # a task's own conversation is kept as it is
    messages = [{"role": "assistant", "content": next(actions)} if m["role"] == "assistant" and i >= opening else m
                for i, m in enumerate(env.chat_messages("hf"))]
    if session.chat.tool_role == "user":
        messages = [{"role": "user", "content": m["content"]} if m["role"] == "tool" else m for m in messages]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return session.chat.encode(session.chat.render(messages[: last + 1]))


def play_tokens(session: Any, policy: Any = None, **reset_kwargs: Any) -> list[int]:
    """Play a :class:`TokenSession` with a text policy (the env's solver by default), each reply
    encoded as a model would sample it; returns the last reply's ids."""
    session.reset(**reset_kwargs)
    policy = policy or session.env.unwrapped.reference_solver()
    last = []
    while not session.done:
        last = model_ids(session.chat, policy(session.obs, session.info))
        session.step(last)
    return last


def assert_token_exact(session: Any, last: list[int]) -> None:
    """The episode's ids are what the template renders for the whole conversation."""
    concat = session.episode.prompt_ids + session.episode.completion_ids
    assert whole_conversation(session) == concat + session.chat.encode(session.chat.turn_rest(last))


class ScriptedEngine:
    """A generation engine with vLLM's ``generate`` shape (as OpenRLHF calls it) whose replies
    come from ``reply(prompt_ids, turn)``: the test's model. A conversation is known by its
    first prompt (every later prompt extends it)."""

    def __init__(self, tokenizer: Any, reply: Any):
        self.tokenizer, self.reply = tokenizer, reply
        self.conversations: list[list[Any]] = []  # [first prompt ids, turns so far]

    def turn(self, prompt_ids: list[int]) -> tuple[list[int], int]:
        for conversation in self.conversations:
            first = conversation[0]
            if len(prompt_ids) > len(first) and prompt_ids[: len(first)] == first:
                conversation[1] += 1
                return first, conversation[1]
        self.conversations.append([list(prompt_ids), 0])
        return list(prompt_ids), 0

    async def generate(self, prompt_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        from types import SimpleNamespace

        first, turn = self.turn(list(prompt_ids))
        text = self.reply(first, turn)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        output = SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


class TinyGenerator:
    """Real token generation with a ``transformers`` model on CPU (sampling, per-token logprobs),
    in the shapes trainers' engines have: ``sample`` (ids in, ids and logprobs out), ``generate``
    as vLLM's (what OpenRLHF's executor awaits) and :meth:`verl_server` (verl's server manager)."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 32, seed: int = 0):
        import torch

        self.model, self.tokenizer, self.max_new_tokens = model.eval(), tokenizer, max_new_tokens
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = __import__("threading").Lock()

    def sample(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> tuple[list[int], list[float]]:
        import torch

        limit = min(max_new_tokens or self.max_new_tokens, self.max_new_tokens)
        ids, logprobs = list(prompt_ids), []
        with self.lock, torch.no_grad():
            past = None
            inputs = torch.tensor([ids])
            for _ in range(limit):
                out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                ids.append(token)
                logprobs.append(float(logp[token]))
                if token == self.tokenizer.eos_token_id:
                    break
                inputs = torch.tensor([[token]])
        return ids[len(prompt_ids):], logprobs

    async def generate(self, prompt_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        from types import SimpleNamespace

        ids, logprobs = self.sample(prompt_ids, getattr(sampling_params, "max_tokens", None))
        stopped = ids and ids[-1] == self.tokenizer.eos_token_id
        output = SimpleNamespace(token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                 finish_reason="stop" if stopped else "length",
                                 logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs)])
        return SimpleNamespace(outputs=[output])

    def verl_server(self) -> Any:
        """An object with verl's ``server_manager.generate(request_id=, prompt_ids=, sampling_params=)``."""
        from verl.workers.rollout.replica import TokenOutput

        generator = self

        class Server:
            async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
                ids, logprobs = generator.sample(prompt_ids, sampling_params.get("max_tokens"))
                return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")

        return Server()
