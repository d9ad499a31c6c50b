"""GRPO on benchmax/Math-v0 with TRL: multi-turn tool use, token-exact, the env's verified reward.

On a GPU (vLLM colocated with training):

    pip install 'benchmax-gym[trl]' vllm
    python examples/trl_grpo.py --model Qwen/Qwen2.5-1.5B-Instruct --use-vllm

On CPU, the smoke version the tests run (a tiny random model and a tokenizer built locally):

    pip install torch==2.13.0 --index-url <PyTorch's CPU wheel index>   # first: else the CUDA build
    pip install 'benchmax-gym[trl]'
    python examples/trl_grpo.py --smoke
"""

from __future__ import annotations

import argparse
import os
import tempfile

import gymnasium as gym

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
INSTALL = "pip install 'benchmax-gym[trl]'"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="benchmax/Math-v0")
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    parser.add_argument("--use-vllm", action="store_true")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--output-dir", default="runs/trl-grpo-math")
    parser.add_argument("--smoke", action="store_true", help="one step on CPU with a tiny local model")
    args = parser.parse_args(argv)
    for name in ("tasks", "max_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def grpo_config(args: argparse.Namespace) -> dict:
    """GRPOConfig's arguments for the GPU run."""
    return dict(output_dir=args.output_dir, per_device_train_batch_size=8, num_generations=8,
                gradient_accumulation_steps=4, max_completion_length=2048, max_steps=args.max_steps,
                learning_rate=1e-6, bf16=True, use_vllm=args.use_vllm, vllm_mode="colocate",
                logging_steps=1, save_steps=100)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    scratch = None
    try:
        from trl import GRPOConfig, GRPOTrainer

        from benchmax_gym.adapters.trl import TRLRollout
    except ImportError as exc:  # one line naming the extra, not a traceback
        raise SystemExit(f"trl_grpo.py needs TRL and transformers: {INSTALL} ({exc})") from None

    if args.smoke:
        from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer("qwen2.5")
        model = tiny_model(tokenizer)
        scratch = tempfile.TemporaryDirectory(prefix="trl-smoke-")  # (the trainer's output: removed at the end)
        config = dict(output_dir=scratch.name, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=64, max_steps=1, use_cpu=True, report_to=[],
                      save_strategy="no", logging_steps=1)
        args.tasks = 8
    else:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
        except OSError as exc:  # not on the Hub, no network, not a model folder
            raise SystemExit(f"trl_grpo.py: --model {args.model}: {' '.join(str(exc).split())}") from None
        model = args.model
        config = grpo_config(args)
    try:
        rollout = TRLRollout(args.env_id, tokenizer, env_kwargs={"max_turns": 4})
    except (gym.error.Error, TypeError, ValueError) as exc:  # an unknown id, an argument the env refuses
        raise SystemExit(f"trl_grpo.py: --env-id {args.env_id}: {exc}") from None
    try:
        trainer = GRPOTrainer(model=model, reward_funcs=rollout.reward, args=GRPOConfig(**config),
                              train_dataset=rollout.dataset(args.tasks), rollout_func=rollout, processing_class=tokenizer)
        trainer.train()
    finally:
        rollout.close()
        if scratch is not None:
            scratch.cleanup()
    logs = trainer.state.log_history[0]
    print({k: v for k, v in logs.items() if k.startswith(("env/", "reward"))})
    return logs


if __name__ == "__main__":
    main()
