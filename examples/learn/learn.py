"""See it learn: a model trained from nothing gets better at benchmax/Math-v0 through benchmax-gym.

No weights are downloaded: the tokenizer and the model are made here, so what the model can do
it learnt from the environment. Six stages, each writing its files into ``--out``:

1. ``data/``: the reference solver plays a generated training split; its transcripts
   (``chat_messages("hf")``) are kept.
2. ``tokenizer/``: a byte-level BPE trained on those transcripts, with Qwen2.5's chat template
   (as TRL ships it: tool calls, tool results, generation prompt), checked by ``ChatTemplate``.
3. ``sft/``: a tiny Qwen2 decoder from a config, trained on the solver's episodes with the
   assistant-only loss (the env mask ``TokenSession`` gives) and stopped early on purpose: once
   greedy success on 64 *training* tasks reaches ``--sft-target`` (no held-out task is looked at),
   else after ``--sft-steps``.
4. ``rl/``: GRPO with TRL's ``GRPOTrainer`` through ``TRLRollout`` (multi-turn, the env's
   calculator, env tokens masked) for a fixed number of steps; ``steps.json`` has each step's
   reward, success, share of zero-variance groups and policy entropy.
5. ``eval_sft/``, ``eval_rl/``, ``compare.json``: both checkpoints, greedy, on a held-out
   generated split (another task seed; prompts seen in training removed, and counted), with
   ``benchmax_gym.eval.stats`` (pass@1 with CI, IQM, per-template breakdown) and ``compare``
   (paired difference and probability of improvement, with CIs).
6. ``plots/``: reward, success, zero-variance groups and entropy per RL step and the eval
   comparison (PNG with the ``plots`` extra; ``figures.json`` always).

``--family wikipedia`` runs the same stages on Wikipedia-v0's generated two-hop questions (tool
results are long: a CPU model of this size does not learn it in minutes; it is there to scale).

CPU (the default config; 5-9 minutes on 2 cores shared with other jobs)::

    python examples/learn/learn.py --out runs/learn

GPU, a bigger model, more steps (vLLM generation for GRPO when installed)::

    python examples/learn/learn.py --out runs/learn-gpu --device cuda --hidden 512 --layers 8 \\
        --train-tasks 20000 --sft-steps 3000 --rl-steps 500 --rl-batch 256  # --use-vllm: untested

The run is deterministic given ``--seed`` on one machine and thread count (torch's deterministic
algorithms are on); ``run.json`` holds the config, versions, seeds, and each stage's wall time
and peak memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS: set before CUDA starts

ENV_ID = "benchmax/Math-v0"
INSTALL = "pip install 'benchmax-gym[trl,plots]'"
# arithmetic expressions of two 2-digit numbers (the generator's default digits; 2 operands, not its 3,
# and no word problems: what a from-scratch model learns in minutes on a CPU), one calculator call
# per turn, so every result is read back from the tool and copied into the answer
DIFFICULTY = {"operands": 2, "digits": 2, "operations": "+-*", "word_problems": 0.0}
# the families the example runs (--family): env id, the metadata field eval breaks results down by,
# and budgets that fit their episodes. Wikipedia-v0: two-hop bridge questions over the smallest
# generated encyclopedia (each task seed makes its own world, so held-out questions are about
# entities never seen in training); its tool results are long, so episodes are ~10x Math's.
FAMILIES = {
    "math": {"env_id": ENV_ID, "by": "template", "max_tokens": 96, "turn_tokens": 40},
    "wikipedia": {"env_id": "benchmax/Wikipedia-v0", "by": "type", "max_tokens": 1536, "turn_tokens": 160},
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/learn", help="the run directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", default="math", choices=sorted(FAMILIES),
                   help="math: Math-v0 arithmetic (the default); wikipedia: Wikipedia-v0 generated questions")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--train-tasks", type=int, default=3000, help="solver transcripts for SFT and BPE")
    p.add_argument("--eval-tasks", type=int, default=300, help="held-out tasks (after removing overlaps)")
    p.add_argument("--operands", type=int, default=DIFFICULTY["operands"], help="numbers in an expression (2-12)")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--sft-steps", type=int, default=700,
                   help="most SFT steps (the learning-rate schedule's length); --sft-target stops it sooner")
    p.add_argument("--sft-target", type=float, default=0.25,
                   help="stop SFT once greedy success on --sft-probe training tasks reaches this (0: never): "
                        "good, not perfect, so GRPO's groups still disagree")
    p.add_argument("--sft-probe", type=int, default=64, help="training tasks the SFT stop rule plays greedily")
    p.add_argument("--sft-check", type=int, default=25, help="SFT steps between two probes")
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--sft-lr", type=float, default=1e-2)
    p.add_argument("--rl-steps", type=int, default=200)
    p.add_argument("--rl-batch", type=int, default=32, help="episodes per GRPO step")
    p.add_argument("--group", type=int, default=8, help="GRPO's num_generations: episodes per prompt")
    p.add_argument("--rl-lr", type=float, default=1e-4)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="completion budget of an episode, all turns (default: the family's, math 96)")
    p.add_argument("--turn-tokens", type=int, default=None,
                   help="most tokens a reply may take at eval (default: the family's, math 40)")
    p.add_argument("--temperature", type=float, default=1.0, help="GRPO's sampling temperature")
    p.add_argument("--sft-from", default=None,
                   help="a run directory whose tokenizer and SFT checkpoint to reuse (same seed and data flags): "
                        "RL experiments without redoing stages 2-3")
    p.add_argument("--use-vllm", action="store_true", help="GRPO generates with vLLM (GPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (0: torch's default); on a shared 2-core machine 1 is several times faster")
    args = p.parse_args(argv)
    family = FAMILIES[args.family]
    args.env_id = family["env_id"]
    for name in ("max_tokens", "turn_tokens"):
        if getattr(args, name) is None:
            setattr(args, name, family[name])
    for name in ("train_tasks", "eval_tasks", "vocab", "hidden", "layers", "heads", "sft_batch", "rl_batch",
                 "group", "max_tokens", "turn_tokens", "sft_probe", "sft_check"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0.0 <= args.sft_target <= 1.0:
        p.error(f"--sft-target must be from 0 to 1 (a success rate; 0: never stop early), got {args.sft_target}")
    if args.sft_from and not (Path(args.sft_from) / "run.json").is_file():
        p.error(f"--sft-from {args.sft_from} is not a run directory of this example (no run.json)")
    if args.rl_batch % args.group:
        p.error(f"--rl-batch ({args.rl_batch}) must be a multiple of --group ({args.group})")
    return args


def require() -> None:
    """The packages the run needs, as one line naming the extra (not a traceback mid-run)."""
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"learn.py needs torch, transformers, tokenizers and TRL: {INSTALL} ({exc})") from None


def env_kwargs(task_seed: int, num_tasks: int, operands: int = DIFFICULTY["operands"],
               family: str = "math") -> dict[str, Any]:
    if family == "wikipedia":
        difficulty = {"entities": 30, "min_hops": 2, "max_hops": 2, "comparison": 0.0}
        return {"task_args": {"task_seed": task_seed, "num_tasks": num_tasks, "difficulty": difficulty},
                "max_turns": 4}
    difficulty = {**DIFFICULTY, "operands": operands}
    return {"task_args": {"task_seed": task_seed, "num_tasks": num_tasks, "difficulty": difficulty},
            "python_tool": False, "max_calls_per_action": 1, "max_turns": 4}


def seeds(seed: int) -> dict[str, int]:
    """Every seed of a run, derived from ``--seed``: the train and held-out task seeds differ."""
    return {"torch": seed, "train_tasks": 1000 + 2 * seed, "heldout_tasks": 1001 + 2 * seed, "eval": seed}


class Stages:
    """Wall time and peak memory of each stage, written into ``run.json`` as they end."""

    def __init__(self, out: Path, run: dict[str, Any]):
        self.out, self.run, self.start = out, run, time.perf_counter()
        run["stages"] = {}

    def __call__(self, name: str):
        stages = self

        class Timer:
            def __enter__(self):
                self.t0 = time.perf_counter()
                print(f"[learn] {name} ...", file=sys.stderr, flush=True)

            def __exit__(self, *exc):
                if exc[0] is None:
                    stages.done(name, time.perf_counter() - self.t0)

        return Timer()

    def done(self, name: str, seconds: float) -> None:
        import torch

        peak = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        if torch.cuda.is_available():
            peak["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        self.run["stages"][name] = {"seconds": round(seconds, 2), **peak}
        self.run["total_seconds"] = round(time.perf_counter() - self.start, 2)
        write_json(self.out / "run.json", self.run)
        print(f"[learn] {name}: {seconds:.1f}s, peak RSS {peak['peak_rss_mb']} MB", file=sys.stderr, flush=True)


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("benchmax-gym", "torch", "transformers", "trl", "tokenizers", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def determinism(seed: int, threads: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)


# -- 1. data -------------------------------------------------------------------------------------


def solver_transcripts(kwargs: dict[str, Any], n: int, env_id: str = ENV_ID) -> list[dict[str, Any]]:
    """The reference solver on tasks ``0..n-1``: each transcript as Hugging Face chat messages."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    env = gym.make(env_id, **kwargs)
    solver = env.unwrapped.reference_solver()
    out = []
    try:
        for i in range(n):
            obs, info = env.reset(options={"task_index": i})
            done, reward = False, 0.0
            while not done:
                obs, reward, terminated, truncated, info = env.step(solver(obs, info))
                done = terminated or truncated
            task = env.unwrapped.episode.task
            out.append({"task_index": i, "task_id": task.id, "prompt": task.prompt, "reward": float(reward),
                        "messages": env.unwrapped.chat_messages("hf")})
    finally:
        env.close()
    return out


def task_prompts(kwargs: dict[str, Any], n: int, env_id: str = ENV_ID) -> list[str]:
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    env = gym.make(env_id, **kwargs)
    try:
        tasks = env.unwrapped.tasks
        return [tasks[i].prompt for i in range(n)]
    finally:
        env.close()


# -- 2. tokenizer and model ---------------------------------------------------------------------


def corpus(transcripts: list[dict[str, Any]]) -> list[str]:
    """The texts a model of this env reads and writes, tool calls as the chat template writes them."""
    lines = []
    for t in transcripts:
        for m in t["messages"]:
            lines.append(m.get("content") or "")
            for call in m.get("tool_calls") or []:
                f = call["function"]
                lines.append(f'<tool_call>\n{{"name": "{f["name"]}", "arguments": {json.dumps(f["arguments"])}}}'
                             "\n</tool_call>")
            if m["role"] == "tool":
                lines.append(f"<tool_response>\n{m['content']}\n</tool_response>")
    return lines


def train_tokenizer(transcripts: list[dict[str, Any]], vocab: int) -> Any:
    """Byte-level BPE (digits split one by one: numbers are copied digit by digit) with Qwen2.5's
    chat template."""
    from importlib.resources import files

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    special = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]  # Qwen2.5's: turn markers, EOS and padding
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special, show_progress=False)
    tok.train_from_iterator(corpus(transcripts), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    tokenizer.add_special_tokens({"additional_special_tokens": special})
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    tokenizer.chat_template = (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")
    tokenizer.padding_side = "left"
    return tokenizer


def make_model(tokenizer: Any, args: argparse.Namespace) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=max(1, args.heads // 2), max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, tie_word_embeddings=True, rope_theta=10000.0)
    return Qwen2ForCausalLM(config)


# -- 3. SFT ---------------------------------------------------------------------------------------


def solver_episodes(chat: Any, kwargs: dict[str, Any], n: int,
                    env_id: str = ENV_ID) -> list[tuple[list[int], list[int]]]:
    """The solver's episodes as token ids and loss masks, exactly as ``TokenSession`` (and so
    ``TRLRollout``) builds them: prompt and env ids 0, the model's ids (ending in EOS) 1."""
    from benchmax_gym.adapters.tokens import TokenSession
    from benchmax_gym.testing.tokenizers import play_tokens

    session = TokenSession(env_id, chat, env_kwargs=kwargs)
    out = []
    try:
        for i in range(n):
            play_tokens(session, options={"task_index": i})
            e = session.episode
            out.append((e.prompt_ids + e.completion_ids, [0] * len(e.prompt_ids) + e.loss_mask))
    finally:
        session.close()
    return out


def sft(model: Any, episodes: list[tuple[list[int], list[int]]], args: argparse.Namespace, pad_id: int,
        log: list[dict[str, float]], probe: Any = None) -> int:
    """Assistant-only cross-entropy, AdamW, warmup then cosine decay over ``--sft-steps`` steps.

    Stopped on purpose once ``probe(model)`` (greedy success on training tasks: no held-out task
    is looked at) reaches ``--sft-target``: where a fixed step count stops differs by seed from
    10% to 57% held-out success, since when copying the tool's result emerges varies; a target
    lands every seed at the same skill, with room and sampling variance left for GRPO.
    Returns the steps taken."""
    import torch

    device = torch.device(args.device)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.sft_lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, args.sft_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(s, args.sft_steps) / max(1, args.sft_steps))))
    rng = random.Random(args.seed)
    order: list[int] = []
    for step in range(args.sft_steps):
        if len(order) < args.sft_batch:
            more = list(range(len(episodes)))
            rng.shuffle(more)
            order += more
        batch, order = [episodes[i] for i in order[: args.sft_batch]], order[args.sft_batch:]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (x, mask) in enumerate(batch):
            ids[row, : len(x)] = torch.tensor(x)
            attn[row, : len(x)] = 1
            labels[row, : len(x)] = torch.tensor([t if m else -100 for t, m in zip(x, mask)])
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device), labels=labels.to(device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        log.append({"step": step + 1, "loss": round(float(out.loss.detach()), 5), "lr": sched.get_last_lr()[0]})
        if (step + 1) % 20 == 0 or step == 0:
            print(f"[learn] sft step {step + 1}/{args.sft_steps} loss {log[-1]['loss']:.4f}", file=sys.stderr,
                  flush=True)
        if probe is not None and args.sft_target > 0 and (step + 1) % args.sft_check == 0 \
                and step + 1 >= args.sft_steps // 2:
            log[-1]["probe_success"] = probe(model)
            model.train()
            print(f"[learn] sft step {step + 1}: greedy success on {args.sft_probe} training tasks "
                  f"{log[-1]['probe_success']:.3f} (target {args.sft_target})", file=sys.stderr, flush=True)
            if log[-1]["probe_success"] >= args.sft_target:
                return step + 1
    return args.sft_steps


# -- 4. RL ----------------------------------------------------------------------------------------


def grpo(model: Any, tokenizer: Any, kwargs: dict[str, Any], args: argparse.Namespace, out: Path,
         steps_log: list[dict[str, float]]) -> Any:
    """GRPO through ``TRLRollout``; each step's batch reward and success rate go in ``steps_log``."""
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout

    rollout = TRLRollout(args.env_id, tokenizer, env_kwargs=kwargs, max_workers=4)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        result = rollout(prompts, trainer)
        rewards = [r for r in result["env_reward"] if r is not None]
        # TRL repeats each prompt --group times in a row: a group whose episodes all score the same
        # has no advantage, so no gradient
        groups = [result["env_reward"][i: i + args.group] for i in range(0, len(result["env_reward"]), args.group)]
        steps_log.append({"step": len(steps_log) + 1, "reward": sum(rewards) / max(1, len(rewards)),
                          "success": sum(r >= 1.0 - 1e-9 for r in rewards) / max(1, len(rewards)),
                          "zero_variance_groups": sum(len(set(g)) == 1 for g in groups) / max(1, len(groups)),
                          "model_tokens": sum(map(sum, result["env_mask"])) / max(1, len(rewards))})
        s = steps_log[-1]
        print(f"[learn] rl step {s['step']}/{args.rl_steps} reward {s['reward']:.3f} success {s['success']:.3f} "
              f"zero-variance groups {s['zero_variance_groups']:.2f}", file=sys.stderr, flush=True)
        return result

    rollout_func.__name__ = "benchmax_rollout"
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.rl_batch, num_generations=args.group,
        max_completion_length=args.max_tokens, max_steps=args.rl_steps, learning_rate=args.rl_lr,
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0, temperature=args.temperature, seed=args.seed,
        data_seed=args.seed,
        use_cpu=args.device == "cpu", report_to=[], logging_steps=1, save_strategy="no", bf16=False,
        use_vllm=args.use_vllm, **({"vllm_mode": "colocate"} if args.use_vllm else {}))
    trainer = GRPOTrainer(model=model, reward_funcs=rollout.reward, args=config,
                          train_dataset=rollout.dataset(args.train_tasks), rollout_func=rollout_func,
                          processing_class=tokenizer)
    try:
        trainer.train()
    finally:
        rollout.close()
    write_json(out / "log_history.json", trainer.state.log_history)
    # the policy's mean entropy per completion token, as TRL measured it on each step's batch
    for entry, h in zip(steps_log, [h for h in trainer.state.log_history if "entropy" in h]):
        entry["entropy"] = h["entropy"]
    trainer.model.config.use_cache = True  # the trainer turns it off; generation wants it
    return trainer.model


# -- 5. eval --------------------------------------------------------------------------------------


def play_greedy(model: Any, chat: Any, kwargs: dict[str, Any], indices: list[int], args: argparse.Namespace,
                batch: int = 64) -> list[dict[str, Any]]:
    """Greedy episodes of the model on tasks ``indices`` (batched turns through ``TokenSession``),
    as ``benchmax_gym.eval`` records."""
    import torch

    from benchmax_gym.adapters.tokens import TokenSession
    from benchmax_gym.core.formats import PARSE_ERROR

    device = torch.device(args.device)
    model.to(device).eval()
    tok = chat.tokenizer
    records = []
    for start in range(0, len(indices), batch):
        chunk = indices[start: start + batch]
        sessions = [TokenSession(args.env_id, chat, env_kwargs=kwargs, max_tokens=args.max_tokens) for _ in chunk]
        errors: list[list[str]] = [[] for _ in chunk]
        try:
            for s, i in zip(sessions, chunk):
                s.reset(options={"task_index": i})
            while active := [k for k, s in enumerate(sessions) if not s.done]:
                inputs = [sessions[k].input_ids for k in active]
                width = max(map(len, inputs))
                ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in inputs], device=device)
                attn = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in inputs], device=device)
                new = min(args.turn_tokens, max(sessions[k].budget for k in active))
                with torch.no_grad():
                    out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=new, do_sample=False,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
                for row, k in enumerate(active):
                    reply = out[row, width:].tolist()
                    if tok.eos_token_id in reply:
                        reply = reply[: reply.index(tok.eos_token_id) + 1]
                    sessions[k].step(reply)
                    errors[k] += list(sessions[k].info.get("errors") or [])
            for s, i, errs in zip(sessions, chunk, errors):
                e = s.episode
                messages = e.record.get("messages", [])
                calls = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
                task = s.env.unwrapped.episode.task
                records.append({
                    "task_index": i, "sample": 0, "seed": args.seed, "task_id": task.id,
                    "metadata": dict(task.metadata), "reward": e.reward,
                    "success": e.reward is not None and e.reward >= 1.0 - 1e-9,
                    "reward_components": dict(e.reward_components), "outcome": e.outcome,
                    "terminated": e.terminated, "truncated": e.truncated, "turns": len(e.turns),
                    "tool_errors": int(e.record.get("tool_errors", 0)), "parse_errors": errs.count(PARSE_ERROR),
                    "errors": errs, "tool_calls": calls, "cut": e.cut, "prompt_tokens": len(e.prompt_ids),
                    "completion_tokens": sum(e.loss_mask),
                    "actions": e.record.get("actions", []),
                })
        finally:
            for s in sessions:
                s.close()
    return records


def tool_use(records: list[dict[str, Any]]) -> dict[str, float]:
    """How the model uses the tool: share of episodes with a well-formed (parsed) tool call, and
    parse and tool errors per turn."""
    turns = sum(r["turns"] for r in records) or 1
    return {"episodes_with_well_formed_call": sum(r["tool_calls"] > 0 for r in records) / len(records),
            "parse_errors_per_turn": sum(r["parse_errors"] for r in records) / turns,
            "tool_errors_per_turn": sum(r["tool_errors"] for r in records) / turns,
            "tool_calls_per_episode": sum(r["tool_calls"] for r in records) / len(records),
            "turns_per_episode": turns / len(records),
            "cut_by_budget": sum(r["cut"] for r in records) / len(records)}


def evaluate_checkpoint(name: str, model: Any, chat: Any, kwargs: dict[str, Any], indices: list[int],
                        args: argparse.Namespace, out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from benchmax_gym.eval.stats import format_summary, summarize

    records = play_greedy(model, chat, kwargs, indices, args)
    summary = summarize(records, seed=args.seed, by=[FAMILIES[args.family]["by"]])
    summary["tool_use"] = tool_use(records)
    folder = out / f"eval_{name}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "rollouts.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    write_json(folder / "summary.json", summary)
    (folder / "summary.txt").write_text(format_summary(summary) + "\n", encoding="utf-8")
    return records, summary


# -- 6. plots -------------------------------------------------------------------------------------


def plots(out: Path, figures: dict[str, Any], comparison: dict[str, Any]) -> list[str]:
    """PNGs (matplotlib, the ``plots`` extra); ``figures.json`` holds their data either way."""
    write_json(out / "plots" / "figures.json", figures)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[learn] matplotlib is not installed (pip install 'benchmax-gym[plots]'): PNG plots skipped; "
              "their data is in plots/figures.json", file=sys.stderr)
        return []
    from benchmax_gym.eval.plots import plot_compare

    made = []
    fig, (a, c, b) = plt.subplots(1, 3, figsize=(13, 3.5))
    steps = [s["step"] for s in figures["rl_steps"]]
    a.plot(steps, [s["reward"] for s in figures["rl_steps"]], label="batch reward")
    a.plot(steps, [s["success"] for s in figures["rl_steps"]], label="batch success", alpha=0.5)
    window = [s["success"] for s in figures["rl_steps"]]
    a.plot(steps, [sum(window[max(0, i - 9): i + 1]) / len(window[max(0, i - 9): i + 1]) for i in range(len(window))],
           label="success, 10-step mean", color="black")
    a.set_xlabel("GRPO step"), a.set_title("RL: reward and success per step"), a.legend(), a.set_ylim(0, 1)
    c.plot(steps, [s["zero_variance_groups"] for s in figures["rl_steps"]], label="groups with no variance", alpha=0.6)
    c.plot(steps, [s.get("entropy", float("nan")) for s in figures["rl_steps"]], label="entropy (nats/token)")
    c.set_xlabel("GRPO step"), c.set_title("RL: what carries a gradient"), c.legend(), c.set_ylim(0, 1)
    names = [n for n in ("sft", "rl") if n in figures["eval"]]
    values = [figures["eval"][n]["success"]["value"] for n in names]
    errs = [[v - (figures["eval"][n]["success"]["ci_low"] or v) for n, v in zip(names, values)],
            [(figures["eval"][n]["success"]["ci_high"] or v) - v for n, v in zip(names, values)]]
    b.bar(names, values, yerr=errs, capsize=6, color=["#999999", "#3b7dd8", "#555555"][: len(names)])
    b.set_ylim(0, 1), b.set_title("held-out success (95% CI)")
    fig.tight_layout()
    fig.savefig(out / "plots" / "learning.png", dpi=80)
    plt.close(fig)
    made.append("plots/learning.png")
    for p in plot_compare(comparison, out / "plots") or []:
        made.append(str(Path(p).relative_to(out)))
    return made


# -- the pipeline ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    require()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    determinism(args.seed, args.threads)
    import torch

    from benchmax_gym.adapters.tokens import ChatTemplate
    from benchmax_gym.eval.stats import compare, format_compare

    s = seeds(args.seed)
    train_kwargs = env_kwargs(s["train_tasks"], args.train_tasks, args.operands, args.family)
    pool = args.eval_tasks * 2  # held-out candidates, before overlaps are removed
    heldout_kwargs = env_kwargs(s["heldout_tasks"], pool, args.operands, args.family)
    run: dict[str, Any] = {"config": vars(args), "seeds": s, "versions": versions(), "env_id": args.env_id,
                           "env_kwargs": {"train": train_kwargs, "heldout": heldout_kwargs},
                           "torch_threads": torch.get_num_threads()}
    stages = Stages(out, run)

    with stages("1_data"):
        transcripts = solver_transcripts(train_kwargs, args.train_tasks, args.env_id)
        (out / "data").mkdir(exist_ok=True)
        with open(out / "data" / "train.jsonl", "w", encoding="utf-8") as f:
            for t in transcripts:
                f.write(json.dumps(t) + "\n")
        train_prompts = {t["prompt"] for t in transcripts}
        candidates = task_prompts(heldout_kwargs, pool, args.env_id)
        heldout = [i for i, p in enumerate(candidates) if p not in train_prompts][: args.eval_tasks]
        overlap = {"candidates": pool, "seen_in_training": sum(p in train_prompts for p in candidates),
                   "heldout_tasks": len(heldout), "heldout_indices": heldout}
        assert not {candidates[i] for i in heldout} & train_prompts
        write_json(out / "data" / "heldout.json", overlap)
        run["data"] = {"train_transcripts": len(transcripts),
                       "solver_success": sum(t["reward"] >= 1 for t in transcripts) / len(transcripts),
                       **{k: v for k, v in overlap.items() if k != "heldout_indices"}}

    if args.sft_from:
        reused_config = json.loads((Path(args.sft_from) / "run.json").read_text())["config"]
        for name in ("seed", "train_tasks", "operands", "vocab", "hidden", "layers", "heads", "sft_steps", "sft_lr",
                     "sft_batch", "sft_target", "sft_probe", "sft_check", "family"):
            if reused_config.get(name) != getattr(args, name):
                raise SystemExit(f"--sft-from {args.sft_from}: its --{name.replace('_', '-')} is "
                                 f"{reused_config.get(name)!r}, this run's {getattr(args, name)!r}")
    with stages("2_tokenizer_model"):
        if args.sft_from:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(Path(args.sft_from) / "tokenizer")
        else:
            tokenizer = train_tokenizer(transcripts, args.vocab)
        tokenizer.save_pretrained(out / "tokenizer")
        chat = ChatTemplate(tokenizer)
        model = make_model(tokenizer, args)
        run["model"] = {"parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer),
                        "hidden": args.hidden, "layers": args.layers}

    with stages("3_sft"):
        episodes = solver_episodes(chat, train_kwargs, args.train_tasks, args.env_id)
        lengths = sorted(len(x) for x, _ in episodes)
        run["data"]["episode_tokens"] = {"median": lengths[len(lengths) // 2], "max": lengths[-1],
                                         "model_tokens_median": sorted(sum(m) for _, m in episodes)[len(episodes) // 2]}
        sft_log: list[dict[str, float]] = []
        if args.sft_from:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(Path(args.sft_from) / "sft")
            sft_log = json.loads((Path(args.sft_from) / "sft" / "loss.json").read_text())
        else:
            probe = list(range(min(args.sft_probe, args.train_tasks)))
            run["sft_steps_taken"] = sft(
                model, episodes, args, tokenizer.pad_token_id, sft_log,
                probe=lambda m: sum(r["success"] for r in play_greedy(m, chat, train_kwargs, probe, args)) / len(probe))
        model.save_pretrained(out / "sft")
        write_json(out / "sft" / "loss.json", sft_log)

    with stages("5a_eval_sft"):
        sft_records, sft_summary = evaluate_checkpoint("sft", model, chat, heldout_kwargs, heldout, args, out)
        print(f"[learn] SFT held-out success {sft_summary['success_rate']['value']:.3f}", file=sys.stderr, flush=True)

    with stages("4_rl"):
        rl_log: list[dict[str, float]] = []
        torch.manual_seed(args.seed)
        model = grpo(model, tokenizer, train_kwargs, args, out / "rl", rl_log)
        model.save_pretrained(out / "rl")
        write_json(out / "rl" / "steps.json", rl_log)

    with stages("5b_eval_rl"):
        rl_records, rl_summary = evaluate_checkpoint("rl", model, chat, heldout_kwargs, heldout, args, out)
        comparison = compare({"sft": sft_records, "rl": rl_records}, seed=args.seed)
        write_json(out / "compare.json", comparison)
        (out / "compare.txt").write_text(format_compare(comparison) + "\n", encoding="utf-8")

    with stages("6_plots"):
        figures = {"rl_steps": rl_log, "sft_loss": sft_log,
                   "eval": {n: {"success": sm["success_rate"], "tool_use": sm["tool_use"]}
                            for n, sm in (("sft", sft_summary), ("rl", rl_summary))}}
        run["plots"] = plots(out, figures, comparison)

    result = results(run, sft_summary, rl_summary, comparison, rl_log)
    run["results"] = result
    write_json(out / "run.json", run)
    print(table(result, run))
    return run


def results(run: dict[str, Any], sft_s: dict[str, Any], rl_s: dict[str, Any], comparison: dict[str, Any],
            rl_log: list[dict[str, float]]) -> dict[str, Any]:
    """The figures the README and the benchmark report."""
    against = comparison["against_baseline"]["rl"]
    k = max(1, len(rl_log) // 5)
    return {
        "heldout_tasks": comparison["shared_tasks"],
        "success": {"sft": sft_s["success_rate"], "rl": rl_s["success_rate"]},
        "iqm_reward": {"sft": sft_s.get("iqm"), "rl": rl_s.get("iqm")},
        "rl_minus_sft": against["mean_difference"], "probability_of_improvement": against["probability_of_improvement"],
        "tasks_better_worse_tied": [against["tasks_better"], against["tasks_worse"], against["tasks_tied"]],
        "tool_use": {"sft": sft_s["tool_use"], "rl": rl_s["tool_use"]},
        "rl_batch_success_first_last": [sum(s["success"] for s in rl_log[:k]) / k,
                                        sum(s["success"] for s in rl_log[-k:]) / k] if rl_log else None,
        "stages": run["stages"],
    }


def table(result: dict[str, Any], run: dict[str, Any]) -> str:
    def ci(e: dict[str, Any]) -> str:
        return f"{e['value']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]" if e.get("ci_low") is not None \
            else f"{e['value']:.3f}"

    tu = result["tool_use"]
    rows = [("held-out success (95% CI)", ci(result["success"]["sft"]), ci(result["success"]["rl"])),
            ("episodes with a well-formed tool call", f"{tu['sft']['episodes_with_well_formed_call']:.3f}",
             f"{tu['rl']['episodes_with_well_formed_call']:.3f}"),
            ("parse errors per turn", f"{tu['sft']['parse_errors_per_turn']:.3f}",
             f"{tu['rl']['parse_errors_per_turn']:.3f}"),
            ("tool errors per turn", f"{tu['sft']['tool_errors_per_turn']:.3f}",
             f"{tu['rl']['tool_errors_per_turn']:.3f}")]
    head = f"{run['env_id']} ({result['heldout_tasks']} held-out tasks, seed {run['config']['seed']})"
    counts = "/".join(map(str, result["tasks_better_worse_tied"]))
    lines = [f"| {head} | SFT | SFT + GRPO |",
             "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows),
             f"\nRL - SFT (paired, 95% CI): {ci(result['rl_minus_sft'])}; probability of improvement "
             f"{ci(result['probability_of_improvement'])}; tasks better/worse/tied {counts}",
             "time per stage: " + ", ".join(f"{k} {v['seconds']:.0f}s" for k, v in run["stages"].items())
             + f"; peak RSS {max(v['peak_rss_mb'] for v in run['stages'].values()):.0f} MB"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
