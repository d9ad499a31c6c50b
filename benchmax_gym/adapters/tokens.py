"""Token-level episodes: what every trainer adapter hands its trainer.

A multi-turn tool loop that decodes the model's reply and re-tokenises the whole conversation
every turn corrupts training data: the ids the trainer computes a loss on are not the ids the
model sampled (BPE merges differ, templates rewrite or drop earlier turns). Here nothing is ever
re-tokenised: the prompt is rendered once, the model's ids are kept exactly as generated, and each
environment turn is rendered by the chat template on its own and appended::

    chat = ChatTemplate(tokenizer)
    session = TokenSession(gym.make("benchmax/Math-v0"), chat)
    ids = session.reset(seed=0)                       # prompt ids
    while not session.done:
        new = generate(session.input_ids)             # the model's ids (and logprobs), any engine
        session.step(new)                             # decoded for the env; env ids appended
    episode = session.episode                         # prompt_ids, completion_ids, loss_mask, ...

``prompt_ids + completion_ids`` equals what the template renders for the whole conversation (the
assistant turns holding the model's text), when the template renders earlier turns as they were
generated. Where a template does not, the ids here are the ones that were sampled and the
template's own rendering is what differs:

* templates that rewrite history. Qwen3's drops the ``<think>`` block of assistant turns
  before the last user message (an env's note, such as the last-turn warning, is one), and
  writes an empty ``<think>\n\n</think>\n\n`` into a last turn that has none: the ids here
  keep what was generated. (Turns after the last user message, as a Qwen3 model writes them,
  match.) Qwen2.5's and Llama 3.1's templates match exactly (tested on every env);
* templates that ``trim`` assistant content (Llama 3): a reply with leading or trailing
  whitespace keeps it here;
* templates whose turn end lacks the stop token the model emitted (an EOS a template never
  writes): the EOS is kept here; templates that write text before it (Llama 2's ``' </s>'``):
  the model's stop token closes the turn, without that text;
* a reply cut by the token budget has no stop token: its turn is closed by environment tokens
  (loss mask 0), which is what the template writes after it;
* message contents holding the text of a special or added token (a tool printing ``<|im_end|>``,
  or Qwen's non-special ``</tool_response>`` in a tool result or a simulated user's words): the
  template's own are its ids, the contents' are plain text (see
  :meth:`ChatTemplate.encode_messages`), where encoding the rendering would make them control tokens.

The token budget (``max_tokens``) is one rule for every adapter: a turn never asks for more than
what is left nor for 0 (:attr:`TokenSession.budget`), a reply longer than what is left is cut,
and environment ids that would leave no room for another reply end the episode *truncated*,
graded as it stands (an empty final reply), without them.

A failed episode (issue 29: the last info's ``outcome`` is one of
:data:`~benchmax_gym.core.outcomes.FAILURES`, a worker lost, a tool gone, a deadline) is never
training signal: its :class:`TokenEpisode` has ``failed`` set, ``reward`` ``None`` (the env's
NaN never reaches a sum) and an all-zero ``loss_mask``; each adapter then keeps it out of its
trainer's loss and group baseline as that trainer allows (see the adapter's docstring).
A generation backend that fails is a failure too, ``model_error``: a reply that is not token ids
of the tokenizer's vocabulary (or whose logprobs do not match them) ends the episode so in
:meth:`TokenSession.step`, and an adapter whose backend raises calls :meth:`TokenSession.fail`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import operator
import re
import threading
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from benchmax_gym.core import outcomes
from benchmax_gym.core.checks import mapping, positive_int
from benchmax_gym.core.tasks import INFINITE

_SENTINEL = "BENCHMAX_SENTINEL_7f3a"
log = logging.getLogger(__name__)
TASK_KEY = "benchmax_task"  # carried by a dataset prompt's first message (TRL's rollout_func sees prompts only)
_BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


class TemplateError(ValueError):
    """The tokenizer or its chat template cannot give exact token episodes (the message says how to fix it)."""


#: what :meth:`ChatTemplate.render` passes the template itself (``apply_chat_template`` its
#: conversation and ``tokenize``): a template variable of one of these names raised TypeError at
#: every render
_RENDER_ARGS = ("messages", "conversation", "add_generation_prompt", "tokenize")


def _check_template_options(chat_template: Any, tools: Any, tool_role: Any, template_kwargs: dict[str, Any]) -> None:
    """:class:`ChatTemplate`'s own options, checked without a tokenizer (:func:`check_chat_kwargs`)."""
    if tool_role not in ("tool", "user"):
        raise TemplateError(f"tool_role must be 'tool' or 'user', got {tool_role!r}")
    if chat_template is not None and not isinstance(chat_template, str):
        raise TemplateError(f"chat_template must be a Jinja chat template string or None, got {chat_template!r:.80}")
    if tools is not None and (not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools)):
        raise TemplateError(f"tools must be a list of tool schemas (dicts) or None, got {tools!r:.80}")
    reserved = sorted(set(template_kwargs) & set(_RENDER_ARGS))
    if reserved:
        raise TemplateError(f"template variables may not be named {reserved}: the template is rendered with them")


def check_chat_kwargs(name: str, value: Any) -> dict[str, Any]:
    """A dict of :class:`ChatTemplate` keyword arguments, checked by its constructor's rules for
    an adapter that builds its template only at its first rollout (when the tokenizer comes):
    a bad option fails where the adapter is configured, naming ``name``, not at every rollout."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict of ChatTemplate options (tool_role, chat_template, tools, "
                         f"template variables), got {value!r:.80}")
    if not all(isinstance(key, str) for key in value):
        raise ValueError(f"{name}: option names must be strings, got {sorted(map(repr, value))}")
    options = dict(value)
    try:
        _check_template_options(options.pop("chat_template", None), options.pop("tools", None),
                                options.pop("tool_role", "tool"), options)
    except TemplateError as exc:
        raise TemplateError(f"{name}: {exc}") from None
    return dict(value)


class ChatTemplate:
    """A Hugging Face tokenizer and its chat template, checked once and rendered incrementally.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        chat_template: a template to use instead of the tokenizer's own.
        tools: tool schemas for the template to render (when the env is made with
            ``tools_in_prompt=False``); ``None`` leaves tools to the env's system prompt.
        tool_role: ``"tool"`` (default) sends tool results as tool messages; ``"user"`` sends
            them as user messages, for templates that cannot render tool messages.
        template_kwargs: extra variables for the template (``enable_thinking=False``, ...).

    An env turn is the hot path of a rollout, so it is rendered from a cached skeleton: for each
    shape of turn (the roles and tool names of its messages) the template is rendered once with
    placeholder contents, and later turns of that shape are the skeleton with their contents put
    in. Only templates that insert content verbatim get a skeleton (placeholders holding quotes,
    backslashes, markup and surrounding whitespace must come out unchanged: no trimming,
    escaping or ``tojson``), and the first turns of each shape are also rendered in full and
    compared; any difference turns skeletons off for the template.
    """

    checks_per_shape = 8

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None, tools: list[dict] | None = None,
                 tool_role: str = "tool", **template_kwargs: Any):
        _check_template_options(chat_template, tools, tool_role, template_kwargs)
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise TemplateError(
                f"the tokenizer ({type(tokenizer).__name__}) has no chat template: load a chat/instruct model's "
                "tokenizer, or pass chat_template=... (a Jinja chat template string)")
        self.tools = tools
        self.tool_role = tool_role
        self.template_kwargs = template_kwargs
        self._compiled = _compiled(tokenizer, self.chat_template)
        # the Rust tokenizer: the same ids as tokenizer.encode, without its Python layers (copies of
        # our own: the tokenizer's keeps the settings of its last call, see _private_backends)
        self._specials, self._structure = _marker_tokens(tokenizer, self.chat_template)
        self._backend, self._literal = _private_backends(tokenizer, self._structure)
        self._plain_decode = self._backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._bytes = _byte_table(tokenizer, self._backend) if self._plain_decode else None
        self._special_re = re.compile("|".join(map(re.escape, self._specials))) if self._specials else None
        self._vocab: int | None = None  # len(tokenizer), on first use
        self._skeletons: dict[tuple, Any] = {}
        self._checks: dict[tuple, int] = {}
        self._checked: set[tuple] = set()  # shapes whose skeleton was checked checks_per_shape times
        self.skeletons_on = True
        # what the template writes after an assistant's content (e.g. "<|im_end|>\n")
        base = self.render([*_BASE, {"role": "assistant", "content": _SENTINEL}])
        if _SENTINEL not in base:
            raise TemplateError("the chat template does not render assistant messages' content")
        self.turn_end = base[base.index(_SENTINEL) + len(_SENTINEL):]
        self._special_ids = _special_ids(tokenizer)
        self.stop_ids = self._stop_ids()
        self._stop_texts = {i: self.tokenizer.decode([i]) for i in self.stop_ids}
        probe = "BENCHMAX_TOOL_PROBE_7f3a"
        try:
            rendered = self._render_turn(self._as_sent(
                [{"role": "tool", "tool_call_id": "call_0", "name": "probe", "content": probe}]))
        except Exception as exc:  # noqa: BLE001  (a template raising on a role it does not know)
            raise TemplateError(
                f"the chat template cannot render tool messages ({exc}); pass tool_role='user' to send tool "
                "results as user messages") from None
        if probe not in rendered or not rendered.startswith(self.turn_end):
            raise TemplateError(
                "the chat template drops tool messages; pass tool_role='user' to send tool results as user messages")

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
        if self._compiled is not None:
            return self._compiled.render(messages=messages, tools=self.tools, add_generation_prompt=add_generation_prompt,
                                         **self.tokenizer.special_tokens_map, **self.template_kwargs)
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, chat_template=self.chat_template, tokenize=False,
            add_generation_prompt=add_generation_prompt, **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self._bytes is not None:
            try:
                return b"".join([self._bytes[i] for i in ids]).decode("utf-8", "replace")
            except IndexError:
                pass
        if self._plain_decode:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The first prompt, rendered with the generation prompt."""
        return self.encode_messages(messages, lambda m: self.render(m, add_generation_prompt=True))

    def encode_messages(self, messages: list[dict[str, Any]], render: Any, *,
                        untrusted: Collection[int] = ()) -> list[int]:
        """``render(messages)`` encoded with special tokens parsed only where the template wrote
        them: a special token's text inside a message (a tool printing ``<|im_start|>system``)
        stays plain text, never a control token. Without such text it is ``encode(render(...))``.

        Special tokens' texts are text in every message, at any depth (a tool call's arguments
        too). A tool result's text, and that of the messages at the indices ``untrusted`` (a
        simulated user's words: an LLM the model's own text can steer), also reads as text the
        non-special added tokens the template writes: Qwen's ``<tool_response>``, ``<tool_call>``
        (and Qwen3's ``<think>``) are such, and a tool or a user writing
        ``</tool_response><tool_response>`` would otherwise forge a tool result. Other messages
        keep those as the trainer's tokenizer reads them: an env's system prompt describing
        ``<tool_call>`` gets the token Qwen's own tools prompt has, an env's note quoting a
        malformed call the tokens the model wrote, an assistant's ``</think>`` the one the model
        writes (and Qwen3's template looks for).

        The contents' special-token texts are swapped for private-use characters, the rendering
        is split at the template's own special tokens (as the tokenizer splits it), and each run
        between them is encoded, characters swapped back, with special-token parsing off."""
        kept = [frozenset() if m.get("role") == "tool" or i in untrusted else self._structure
                for i, m in enumerate(messages)]
        if self._special_re is None or not any(x.group() not in keep for m, keep in zip(messages, kept)
                                               for text in _strings(m) for x in self._special_re.finditer(text)):
            return self.encode(render(messages))
        texts = "".join(_strings(messages))
        base = 0xF0000  # private-use characters no content holds
        while any(chr(base + i) in texts for i in range(len(self._specials))):
            base += len(self._specials)
        swap = {t: chr(base + i) for i, t in enumerate(self._specials)}
        back = str.maketrans({c: t for t, c in swap.items()})

        def escape(value: Any, keep: frozenset = frozenset()) -> Any:
            if isinstance(value, str):
                return self._special_re.sub(lambda x: x.group() if x.group() in keep else swap[x.group()], value)
            if isinstance(value, dict):
                return {k: escape(v, keep) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [escape(v, keep) for v in value]
            return value

        escaped = [{k: escape(v, keep) for k, v in m.items()} for m, keep in zip(messages, kept)]
        text, ids, at = render(escaped), [], 0
        for match in self._special_re.finditer(text):
            ids += self._encode_literal(text[at:match.start()].translate(back))
            ids.append(self.tokenizer.convert_tokens_to_ids(match.group()))
            at = match.end()
        return ids + self._encode_literal(text[at:].translate(back))

    def _encode_literal(self, text: str) -> list[int]:
        if not text:
            return []
        if self._literal is not None:
            return self._literal.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def render_turn(self, messages: list[dict[str, Any]]) -> str:
        """What the template writes after an assistant's content when ``messages`` follow: its
        turn end, ``messages``, the next generation prompt. (Rendered after a stand-in turn, so
        templates that render the last assistant turn differently, like Qwen3's, still give the
        text that follows a turn that is not last.)"""
        if self.tool_role == "user":
            messages = self._as_sent(messages)
        if not self.skeletons_on:
            return self._render_turn(messages)
        shape = tuple([(m["role"], m.get("name")) for m in messages])
        skeleton = self._skeletons.get(shape, False)
        if skeleton is False:
            skeleton = self._skeletons[shape] = self._skeleton(messages)
        if skeleton is None:
            return self._render_turn(messages)
        pieces, slots = skeleton
        out = [pieces[0]]
        for (i, key), piece in zip(slots, pieces[1:]):
            out += (messages[i][key], piece)
        text = "".join(out)
        if shape not in self._checked:
            self._checks[shape] = self._checks.get(shape, 0) + 1
            if self._checks[shape] >= self.checks_per_shape:
                self._checked.add(shape)
            full = self._render_turn(messages)
            if full != text:
                self.skeletons_on = False
                log.warning("chat template: a turn rendered from its skeleton differed from the full "
                            "rendering; rendering every turn in full from now on")
                return full
        return text

    def env_text(self, messages: list[dict[str, Any]], model_ids: list[int]) -> str:
        """The environment's text after the model's ``model_ids``: what :meth:`render_turn` gives,
        less the stop token the model already generated (all of it when the model stopped
        without one, so its turn is closed)."""
        text = self.render_turn(messages)
        closed = self._closed(model_ids)
        return text[closed:] if closed and text.startswith(self.turn_end[:closed]) else text

    def env_ids(self, messages: list[dict[str, Any]], model_ids: list[int], *,
                untrusted: Collection[int] = ()) -> list[int]:
        """:meth:`env_text` as ids (``untrusted``: see :meth:`encode_messages`)."""
        return self.encode_messages(messages, lambda m: self.env_text(m, model_ids), untrusted=untrusted)

    def turn_rest(self, model_ids: list[int]) -> str:
        """The part of the template's final turn end the model did not generate."""
        if not self._stop_text(model_ids):
            return self.turn_end
        closed = self._closed(model_ids)
        return self.turn_end[closed:] if closed else ""

    def garbage(self, model_ids: Any, logprobs: Any = None) -> str | None:
        """What is wrong with a generation backend's reply (``None``: nothing): not a sequence of
        ids of this tokenizer's vocabulary, or logprobs that do not pair with them. No model writes
        such a reply: it is the backend's failure (``model_error``), never the model's mistake."""
        if isinstance(model_ids, (str, bytes)) or not hasattr(model_ids, "__len__"):
            return f"{type(model_ids).__name__}, not token ids"
        try:
            ids = [operator.index(i) for i in model_ids]
        except TypeError:
            return "token ids that are not integers"
        if self._vocab is None:
            try:
                self._vocab = len(self.tokenizer)
            except TypeError:
                self._vocab = 0  # unknown: not checked
        if ids and (min(ids) < 0 or (self._vocab and max(ids) >= self._vocab)):
            return f"token ids outside the vocabulary (0..{self._vocab - 1})"
        if logprobs is not None and (isinstance(logprobs, (str, bytes)) or not hasattr(logprobs, "__len__")
                                     or len(logprobs) != len(ids)):
            return f"logprobs that do not pair with its {len(ids)} token ids"
        return None

    def text(self, model_ids: list[int]) -> str:
        """The reply the env reads: the model's ids decoded, without the final stop token (any
        special token: engines also stop on the generation config's other EOS ids, Qwen2.5's
        ``<|endoftext|>``, and keep it in the ids but not in the text)."""
        if model_ids and (model_ids[-1] in self.stop_ids or model_ids[-1] in self._special_ids):
            model_ids = model_ids[:-1]
        return self.decode(model_ids)

    # -- internals ------------------------------------------------------------------------------

    def _as_sent(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.tool_role == "user":
            return [{"role": "user", "content": m["content"]} if m["role"] == "tool" else m for m in messages]
        return messages

    def _render_turn(self, messages: list[dict[str, Any]]) -> str:
        text = self.render([*_BASE, {"role": "assistant", "content": _SENTINEL}, *messages], add_generation_prompt=True)
        return text[text.index(_SENTINEL) + len(_SENTINEL):]

    def _skeleton(self, messages: list[dict[str, Any]]) -> tuple[list[str], list[tuple[int, str]]] | None:
        """The turn's text split around its messages' contents and tool call ids, or ``None``
        when the template does not insert them verbatim (so a skeleton would not be exact)."""
        keys = [(i, k) for i, m in enumerate(messages) for k in ("content", "tool_call_id") if isinstance(m.get(k), str)]
        renders = []
        for variant in ("A", "B"):
            marks = {slot: f' \n"\\<{variant}{n}&{{x}}>\n ' for n, slot in enumerate(keys)}
            probe = [dict(m) for m in messages]
            for (i, k), mark in marks.items():
                probe[i][k] = mark
            try:
                text = self._render_turn(probe)
            except Exception:  # noqa: BLE001  (the full rendering will raise it, where it belongs)
                return None
            found = sorted((text.find(mark), slot, mark) for slot, mark in marks.items() if mark in text)
            if any(text.count(mark) > 1 for _, _, mark in found):
                return None
            pieces, at = [], 0
            for position, _, mark in found:
                pieces.append(text[at:position])
                at = position + len(mark)
            pieces.append(text[at:])
            renders.append((pieces, [slot for _, slot, _ in found]))
        if renders[0] != renders[1] or not any(k == "content" for _, k in renders[0][1]):
            return None
        if len([s for s in renders[0][1] if s[1] == "content"]) != sum(1 for _, k in keys if k == "content"):
            return None  # a content the template changes (trims, escapes) or drops
        return renders[0]

    def _stop_text(self, model_ids: list[int]) -> str:
        return self._stop_texts.get(model_ids[-1], "") if model_ids else ""

    def _closed(self, model_ids: list[int]) -> int:
        """How much of the turn end the model's stop token stands for: up to and including the
        stop token's text, which a template may write after whitespace (Llama 2's ``' </s>'``:
        appending all of it wrote a second EOS); 0 without a stop token in the turn end."""
        stop = self._stop_text(model_ids)
        at = self.turn_end.find(stop) if stop else -1
        return at + len(stop) if at >= 0 else 0

    def _stop_ids(self) -> set[int]:
        """EOS, and the special token that opens the template's turn end (``<|im_end|>``, ``<|eot_id|>``)."""
        stops = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None:
            stops.update(eos if isinstance(eos, list) else [eos])
        end_ids = self.encode(self.turn_end)
        if end_ids and end_ids[0] in self._special_ids:
            stops.add(end_ids[0])
        return stops


def users_words(env: Any, messages: list[dict[str, Any]]) -> set[int]:
    """The indices of a step's messages that its simulated user said (:mod:`core.users`): their
    markup is to be read as text, as a tool result's is. Where they cannot be told from the
    engine's notes (a remote env, messages a wrapper changed), every user message is."""
    episode = getattr(getattr(env, "unwrapped", env), "episode", None)
    usage = getattr(episode, "user", None)
    if usage is None:
        return set()
    first = len(episode.messages) - len(messages)
    users = {j for j, m in enumerate(messages) if m.get("role") == "user"}
    if not usage.turns or first < 0 or episode.messages[first:] != messages:
        return users
    return {j for j in users if first + j in usage.turns}


def _special_ids(tokenizer: Any) -> set[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return special | {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}


def _marker_tokens(tokenizer: Any, template: str) -> tuple[list[str], frozenset]:
    """The texts of the tokenizer's special tokens and of the non-special added tokens its chat
    template writes, longest first (the regex tries them in order); and those non-special ones,
    the template's markup (Qwen's ``<tool_call>``, ``<tool_response>``). Other non-special added
    tokens (words, whitespace runs, Qwen's ``<|fim_prefix|>``) are left as the tokenizer reads them."""
    added = {t.content: t.special for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.content}
    special = set(getattr(tokenizer, "all_special_tokens", []) or []) | {t for t, s in added.items() if s}
    structure = frozenset(t for t, s in added.items() if not s and t not in special and t.strip() and t in template)
    return sorted((t for t in special | structure if t), key=len, reverse=True), structure


def _strings(value: Any) -> Any:
    """Every string in messages, at any depth (contents, tool calls' arguments, content parts)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


_PRIVATE_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _private_backends(tokenizer: Any, structure: frozenset = frozenset()) -> tuple[Any, Any]:
    """Copies of a fast tokenizer's Rust tokenizer for templates alone, without truncation or
    padding: one that parses special tokens, one that reads their texts and ``structure``'s
    (non-special added tokens) as plain text (``None`` for a slow tokenizer). transformers
    leaves each call's settings on the tokenizer's own (``truncation=True, max_length=...``,
    ``padding``, ``split_special_tokens``) until its next call: encoding with that after a
    trainer's ``tokenizer(..., truncation=True, max_length=5)`` cut a prompt to 5 ids, and after
    ``split_special_tokens=True`` made the template's own special tokens text. Made once per
    tokenizer (verl builds a template per trajectory); never changed."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None, None
    key = (id(backend), backend.get_vocab_size(with_added_tokens=True), structure)  # a token added since: copy again
    try:
        cached = _PRIVATE_BACKENDS.get(tokenizer)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    from tokenizers import Tokenizer

    copies, spec = [], backend.to_str()
    for literal in (False, True):
        if literal and structure:  # the template's non-special markup read as text too
            config = json.loads(spec)
            for token in config.get("added_tokens") or []:
                token["special"] = token["special"] or token["content"] in structure
            spec = json.dumps(config)
        own = Tokenizer.from_str(spec)
        own.no_truncation()
        own.no_padding()
        own.encode_special_tokens = literal
        copies.append(own)
    try:
        _PRIVATE_BACKENDS[tokenizer] = (key, *copies)
    except TypeError:
        pass
    return copies[0], copies[1]


def _byte_levels() -> dict[str, int]:
    """GPT-2's map from the printable characters byte-level BPE writes back to the bytes they stand for."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_table(tokenizer: Any, backend: Any) -> list[bytes] | None:
    """Each id's bytes, for a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen): decoding is then a
    join (4 µs -> ~1 µs a turn). ``None`` for any other decoder, or when a check against the
    tokenizer's own decode differs."""
    if type(getattr(backend, "decoder", None)).__name__ != "ByteLevel":
        return None
    byte_of = _byte_levels()
    size = backend.get_vocab_size(with_added_tokens=True)
    table: list[bytes] = [b""] * size
    added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    for token, i in backend.get_vocab(with_added_tokens=False).items():
        if i < size:
            try:
                table[i] = bytes(byte_of[c] for c in token)
            except KeyError:
                return None
    for i, content in added.items():
        if i < size:
            table[i] = content.encode("utf-8")
    probes = [backend.encode(text, add_special_tokens=False).ids
              for text in ("Hello, wörld ✓ 日本語 \n\t  x", "<tool_call>\n{\"a\": 1}</tool_call>")]
    probes.append(probes[0][:3] + probes[0][-2:])  # multi-byte characters cut mid-way
    probes.append(list(added)[:8])
    for ids in probes:
        if b"".join(table[i] for i in ids).decode("utf-8", "replace") != backend.decode(ids, skip_special_tokens=False):
            return None
    return table


def _compiled(tokenizer: Any, template: str) -> Any:
    """The template compiled as ``apply_chat_template`` compiles it (its cache), to render
    without that method's per-call Python work; ``None`` when transformers does not expose it."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(template)
    except Exception:  # noqa: BLE001  (fall back to apply_chat_template)
        return None


@dataclass
class TokenEpisode:
    """One episode as token ids. ``completion_ids`` holds everything after the prompt in order:
    the model's ids (``loss_mask`` 1) and the environment's (``loss_mask`` 0)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # per completion token; 0.0 for environment tokens
    turns: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each model turn in completion_ids
    # each model turn's reward (the env's step reward; per-turn rewards, issue 30), aligned with ``turns``
    turn_rewards: list[float] = field(default_factory=list)
    reward: float | None = 0.0  # the episode's return, the sum of turn_rewards; None: a failed episode
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    cut: bool = False  # the token budget ended it (truncated, graded as it stands)
    info: dict[str, Any] = field(default_factory=dict)  # the last step's
    record: dict[str, Any] = field(default_factory=dict)  # env.episode_record(): the transcript, never the answer
    outcome: str | None = None  # the last info's ``outcome`` (issue 29); None until it ends, or from an older env

    @property
    def failed(self) -> bool:
        """Not the model's doing (a worker lost, a tool gone...): never in a loss or a baseline."""
        return outcomes.is_failure(self.outcome)

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def token_rewards(self) -> list[float]:
        """One reward per completion token: each turn's reward on its last token, 0 elsewhere (the
        layout of per-token rewards for PPO-style trainers). All zero for a failed episode."""
        out = [0.0] * len(self.completion_ids)
        if not self.failed:
            for (start, end), reward in zip(self.turns, self.turn_rewards):
                if end > start:
                    out[end - 1] += reward
        return out

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def metrics(self, components: bool = True) -> dict[str, float]:
        """What adapters put in a trainer's logs: the reward, turns, tool errors, whether the
        budget cut it, and (``components``) the reward's components, which differ between envs:
        trainers that batch per-sample keys by the first sample's take ``components=False``.
        A failed episode's ``reward`` here is NaN (every sample has the key; no fake 0), and
        :meth:`outcome_metrics` are always in."""
        dense = math.nan if self.reward is None else float(sum(self.turn_rewards[:-1]))
        out = {"reward": self.reward if self.reward is not None else math.nan, "turns": float(len(self.turns)),
               "turn_reward": dense,  # what the turns before the last paid (per-turn rewards; 0 without)
               "tool_errors": float(self.record.get("tool_errors", 0)), "truncated": float(self.cut),
               **self.outcome_metrics()}
        if components:
            out.update({f"reward/{k}": float(v) for k, v in self.reward_components.items()})
            out.update(self.member_metrics(out))
        return out

    def member_metrics(self, metrics: dict[str, float] | None = None) -> dict[str, float]:
        """A mixture's episode (``benchmax/Mix-v0``): its reward, turns and tool errors again under
        ``<member>/...`` (logged as ``env/<member>/...``), so each member is seen apart; {} otherwise."""
        member = self.info.get("member") if isinstance(self.info, dict) else None
        if not member:
            return {}
        metrics = metrics or self.metrics(components=False)
        out = {f"{member}/{k}": metrics[k] for k in ("reward", "turns", "tool_errors", "truncated")}
        if "difficulty" in self.info:
            out[f"{member}/difficulty"] = float(self.info["difficulty"])
        return out

    def outcome_metrics(self) -> dict[str, float]:
        """``env/outcome/<name>``: 1.0 for this episode's outcome, 0.0 for every other (every episode
        has every key, so trainers that batch by the first sample's keys count them all; summed
        over a batch they are the counts). An episode without one counts as ``scored``."""
        mine = self.outcome if self.outcome in outcomes.OUTCOMES else outcomes.SCORED
        return {f"env/outcome/{name}": float(name == mine) for name in sorted(outcomes.OUTCOMES)}


class TokenSession:
    """Plays one environment at the token level (see the module docstring).

    Args:
        env: a made env, or an env id (made with ``env_kwargs``).
        chat: the :class:`ChatTemplate` (or a tokenizer, wrapped with defaults).
        max_tokens: budget for ``completion_ids`` (at least 1): a reply is cut to what is left,
            and env ids that would leave nothing for the next reply end the episode (truncated,
            graded as it stands).

    The async methods run the env's ``reset``/``step`` in a worker thread: a trainer's event
    loop (verl's agent-loop worker) keeps serving other trajectories while a tool or a
    database copy works, and the env sees the same calls, through the same wrappers, as
    the sync methods make. A trainer that cancels a rollout cannot stop that thread, so a
    :meth:`close` that comes while it runs is done when it returns: an env is never closed
    under a running reset or step (which would open a workspace or a server after close).
    """

    def __init__(self, env: gym.Env | str, chat: ChatTemplate | Any, *, max_tokens: int | None = None,
                 env_kwargs: dict[str, Any] | None = None):
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 1):
            raise ValueError(f"max_tokens must be an int of at least 1 (or None: no budget), got {max_tokens!r}")
        self.env = make_env(env, env_kwargs) if isinstance(env, str) else env
        # behind Gymnasium's default wrappers only (their checks hold here: reset comes first), the
        # env's own step, as the vector workers call it
        from benchmax_gym.wrappers.worker import async_api

        self._env_step = self.env.unwrapped.step if async_api(self.env) is not None else self.env.step
        self.chat = chat if isinstance(chat, ChatTemplate) else ChatTemplate(chat)
        self.max_tokens = max_tokens
        self.episode: TokenEpisode | None = None
        self.obs, self.info = "", {}  # the env's last observation and info, for text policies
        self._calls = threading.Lock()  # guards the two flags below
        self._running = False  # an async method's env call runs in a worker thread
        self._closing = False  # close() was called: no call starts; a running one closes the env when done

    @property
    def done(self) -> bool:
        return self.episode is None or self.episode.done

    @property
    def input_ids(self) -> list[int]:
        return self.episode.input_ids

    @property
    def budget(self) -> int | None:
        """Tokens the next reply may take (``None``: unbounded); at least 1 while the episode runs."""
        if self.max_tokens is None:
            return None
        return max(self.max_tokens - len(self.episode.completion_ids), 0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> list[int]:
        return self._start(*self.env.reset(seed=seed, options=options))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> list[int]:
        return self._start(*await self._in_thread(self.env.reset, seed=seed, options=options))

    def step(self, model_ids: list[int], logprobs: list[float] | None = None) -> list[int]:
        """Append the model's ids, step the env with their text; returns the env's ids (empty once
        done). Ids that are not the tokenizer's (garbage from the backend) end it: ``model_error``."""
        action = self._add_model_turn(model_ids, logprobs)
        if action is None:
            return []
        ids = self._add_env_turn(*self._env_step(action))
        return self._cut(self._graded_as_it_stands()) if ids is None else ids

    async def astep(self, model_ids: list[int], logprobs: list[float] | None = None) -> list[int]:
        action = self._add_model_turn(model_ids, logprobs)
        if action is None:
            return []
        ids = self._add_env_turn(*await self._in_thread(self._env_step, action))
        return self._cut(await self._in_thread(self._graded_as_it_stands)) if ids is None else ids

    def fail(self, outcome: str = outcomes.MODEL_ERROR, error: str = "") -> None:
        """End the running episode as a failure that is not the model's (issue 29): the generation
        backend raised or timed out (``model_error``). No reward, no token in the loss; the env's
        episode is left ungraded (the next reset or close releases it)."""
        if outcome not in outcomes.FAILURES:
            raise ValueError(f"outcome must be one of {sorted(outcomes.FAILURES)}, got {outcome!r}")
        episode = self.episode
        if episode is None or episode.done:
            raise gym.error.ResetNeeded("call reset() before fail(); the episode has ended")
        log.warning("episode failed (%s): %s", outcome, error)
        info = {**self.info, "outcome": outcome, "error": error, "reward_components": {}}
        episode.info = self.info = info
        episode.terminated, episode.truncated, episode.outcome = False, True, outcome
        episode.reward, episode.reward_components = None, {}
        episode.turn_rewards = [0.0] * len(episode.turn_rewards)  # as _end leaves a failure's: none paid
        episode.loss_mask = [0] * len(episode.loss_mask)
        episode.record = {**self.env.unwrapped.episode_record(), "outcome": outcome, "reward": None, "error": error}

    def close(self) -> None:
        """Close the env, once; while an async method's env call runs (its rollout was
        cancelled), that call closes it when it returns."""
        with self._calls:
            if self._closing:
                return
            self._closing = True
            if self._running:
                return
        self.env.close()

    # -- internals ------------------------------------------------------------------------------

    async def _in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call, fn, *args, **kwargs)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One env call, in a worker thread: never after :meth:`close`, and a close that came
        while it ran is done when it returns."""
        with self._calls:
            if self._closing:
                raise gym.error.ClosedEnvironmentError("the session's env was closed")
            self._running = True
        try:
            return fn(*args, **kwargs)
        finally:
            with self._calls:
                self._running = False
                close = self._closing
            if close:  # (its caller was cancelled: nobody would see the close's error)
                try:
                    self.env.close()
                except Exception as exc:
                    log.warning("closing an env after its cancelled call returned raised %s: %s (its "
                                "resources may leak)", type(exc).__name__, exc)

    def _start(self, obs: str, info: dict[str, Any]) -> list[int]:
        self.obs, self.info = obs, info
        messages = self.env.unwrapped.chat_messages("hf")
        self.episode = TokenEpisode(prompt_ids=self.chat.prompt_ids(messages), info=info)
        return list(self.episode.prompt_ids)

    def _add_model_turn(self, model_ids: list[int], logprobs: list[float] | None) -> str | None:
        """The reply's text for the env; ``None`` when the reply is garbage (the episode failed)."""
        episode = self.episode
        if episode is None or episode.done:
            raise gym.error.ResetNeeded("call reset() before step(); the episode has ended")
        garbage = self.chat.garbage(model_ids, logprobs)
        if garbage:
            self.fail(outcomes.MODEL_ERROR, f"the generation backend returned {garbage}")
            return None
        model_ids = [operator.index(i) for i in model_ids]
        budget = self.budget
        if budget is not None and len(model_ids) > budget:
            model_ids, logprobs = model_ids[:budget], (logprobs[:budget] if logprobs is not None else None)
        start = len(episode.completion_ids)
        if logprobs is not None and episode.logprobs is None:
            episode.logprobs = [0.0] * start
        episode.completion_ids += model_ids
        episode.loss_mask += [1] * len(model_ids)
        if episode.logprobs is not None:
            episode.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(model_ids)
        episode.turns.append((start, len(episode.completion_ids)))
        self._last_ids = model_ids
        return self.chat.text(model_ids)

    def _add_env_turn(self, obs: str, reward: float, terminated: bool, truncated: bool,
                      info: dict[str, Any]) -> list[int] | None:
        """The env's ids, appended; ``None`` when they would spend the budget (the caller grades
        the episode with an empty final reply, then :meth:`_end`)."""
        episode = self.episode
        episode.info = self.info = info
        self.obs = obs
        episode.turn_rewards.append(float(reward))
        if terminated or truncated:
            return self._end(obs, reward, terminated, truncated, info)
        messages = info["messages"]  # (rendering only reads them)
        ids = self.chat.env_ids(messages, self._last_ids, untrusted=self._users_words(messages))
        if self.max_tokens is not None and len(episode.completion_ids) + len(ids) >= self.max_tokens:
            return None
        episode.completion_ids += ids
        episode.loss_mask += [0] * len(ids)
        if episode.logprobs is not None:
            episode.logprobs += [0.0] * len(ids)
        return ids

    def _users_words(self, messages: list[dict[str, Any]]) -> set[int]:
        """:func:`users_words` of this session's env."""
        return users_words(self.env, messages)

    def _graded_as_it_stands(self) -> tuple:
        """The step that ends an episode the budget cut: an empty final reply. In an env with a
        simulated user that reply goes to the user; if they talk on, empty replies follow (no
        tokens: the budget is spent) until they are done or the turn limit grades it."""
        while True:
            result = self._env_step("")
            if result[2] or result[3]:
                return result

    def _cut(self, graded: tuple) -> list[int]:
        """End an episode the budget cut, with the step that graded it (an empty final reply)."""
        obs, reward, _, _, info = graded
        self.episode.cut = True
        self.episode.turn_rewards[-1] += float(reward)  # the grading step closes the last turn
        return self._end(obs, reward, False, True, info)

    def _end(self, obs: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> list[int]:
        episode = self.episode
        episode.info = self.info = info
        self.obs = obs
        # the return: each turn's reward (0 before the last without per-turn rewards) summed
        episode.reward, episode.terminated, episode.truncated = float(sum(episode.turn_rewards)), terminated, truncated
        episode.outcome = info.get("outcome")
        if episode.failed:  # no reward, no loss: the trainer adapters keep it out (issue 29)
            episode.reward = None
            episode.turn_rewards = [0.0] * len(episode.turn_rewards)
            episode.loss_mask = [0] * len(episode.loss_mask)
        episode.reward_components = dict(info.get("reward_components", {}))
        episode.record = self.env.unwrapped.episode_record()
        return []


def outcome_counts(episodes: list[TokenEpisode] | list[dict[str, float]]) -> dict[str, float]:
    """``env/outcome/<name>``: how many of ``episodes`` (or their metrics dicts) ended so,
    every name present: what each adapter logs per batch."""
    counts = {f"env/outcome/{name}": 0.0 for name in sorted(outcomes.OUTCOMES)}
    for episode in episodes:
        for name, value in (episode if isinstance(episode, dict) else episode.outcome_metrics()).items():
            if name in counts:
                counts[name] += float(value)
    return counts


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """``gym.make`` for adapters: an unknown id fails naming the registered benchmax ids. A
    mixture with a curriculum follows the process's one controller for its id and kwargs
    (:func:`benchmax_gym.mix.share_curriculum`): adapters make an env per trajectory or slot."""
    import benchmax_gym  # noqa: F401  (registers the benchmax/* ids)
    from benchmax_gym.mix import share_curriculum

    if env_kwargs is not None:  # (a list raised "argument after ** must be a mapping", naming nothing)
        mapping("env_kwargs", env_kwargs)
    try:
        env = gym.make(env_id, **(env_kwargs or {}))
    except (gym.error.NameNotFound, gym.error.NamespaceNotFound, gym.error.VersionNotFound) as exc:
        from benchmax_gym.registry import env_ids

        raise gym.error.Error(f"{exc} Registered benchmax ids: {', '.join(env_ids())}") from None
    share_curriculum(env, env_id, env_kwargs)
    return env


async def amake_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """:func:`make_env` in a worker thread, off the trainer's event loop (building an env may copy
    a database or start a server). If the awaiting rollout is cancelled meanwhile, the env is
    closed once built: it is no one else's to close."""
    lock, handed = threading.Lock(), {}

    def build() -> gym.Env | None:
        env = make_env(env_id, env_kwargs)
        with lock:
            if "abandoned" not in handed:
                handed["env"] = env
                return env
        env.close()
        return None

    try:
        return await asyncio.to_thread(build)
    except asyncio.CancelledError:
        with lock:
            handed["abandoned"] = True
            env = handed.get("env")
        if env is not None:  # built just as the rollout was cancelled
            env.close()
        raise


def task_dataset(env_id: str, n: int | None = None, *, env_kwargs: dict[str, Any] | None = None,
                 mark_task: bool = False) -> Any:
    """A ``datasets.Dataset`` with one row per task: ``prompt`` (the env's opening messages) and
    ``task_index``. ``n`` caps the rows (generated sources have no end: the default is 1,000)."""
    import datasets

    if n is not None:  # (0 or -1 gave an empty dataset, "3" a bare TypeError)
        positive_int("n", n)

    env = make_env(env_id, env_kwargs)
    try:
        base = env.unwrapped
        size = len(base.tasks) if hasattr(base.tasks, "__len__") else 1000
        if size >= INFINITE:  # (an endless generated source says 2**62: n=None built rows until memory ran out)
            size = 1000
        rows = []
        for index in range(min(size, n) if n is not None else size):
            env.reset(options={"task_index": index})  # a task's prompt may describe its files (Excel)
            messages = base.chat_messages("hf")
            if mark_task:  # the env and the task, as JSON: rows of several envs may share a dataset
                mark = json.dumps({"env_id": env_id, "task_index": index, "env_kwargs": env_kwargs or {}})
                messages = [{**m, TASK_KEY: mark if i == 0 else None} for i, m in enumerate(messages)]
            rows.append({"prompt": messages, "task_index": index})
    finally:
        env.close()
    return datasets.Dataset.from_list(rows)


__all__ = ["ChatTemplate", "TemplateError", "TokenEpisode", "TokenSession", "amake_env", "check_chat_kwargs",
           "make_env", "outcome_counts", "task_dataset"]
