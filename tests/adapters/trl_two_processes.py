"""One process of a real two-process GRPOTrainer run on CPU (gloo), launched by
``test_trl_group.py``: ``python trl_two_processes.py OUT_DIR`` with ``RANK``, ``WORLD_SIZE``
and ``LOCAL_RANK`` set. The process group meets through a file (no TCP store), gloo's own
sockets on the loopback interface only.

Two GRPO steps through :class:`TRLRollout` (``failed_group="drop"``, a group rubric scoring each
member with its group's size), ``num_generations=2``, ``per_device_train_batch_size=3``: TRL's
sampler gives process 0 prompts ``[a, a, b]`` and process 1 ``[b, c, c]``, so group ``b`` is
split between them. At the second step process 0's ``b`` sample fails (a tool backend lost).
Each process writes what its rollout_func got and returned to ``OUT_DIR/rank<k>.json``."""

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # flaky.py


def main(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=world)

    from flaky import ENV_ID
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.core.group import GroupRubric
    from benchmax_gym.testing.tokenizers import model_ids, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen")
    calls = []

    def scripted(trainer, sessions):
        pool = next(iter(rollout._sessions.values()))
        ids = []
        for s in sessions:
            reply = s.env.unwrapped.reference_solver()(s.obs, s.info)
            if len(calls) == 1 and rank == 0 and pool.index(s) == 2:  # step 2: process 0's sample of group b
                reply = "FAULT " + reply
            ids.append(model_ids(s.chat, reply))
        return ids, [None] * len(ids)

    def size(rewards):  # each member's score: how many members its group had
        return [float(len(rewards))] * len(rewards)

    class Recorded(TRLRollout):
        def __call__(self, prompts, trainer):
            out = super().__call__(prompts, trainer)
            calls.append({"tasks": [json.loads(p[0]["benchmax_task"])["task_index"] for p in prompts],
                          "env_reward": out["env_reward"], "mask_sums": [sum(m) for m in out["env_mask"]],
                          "num_processes": trainer.accelerator.num_processes,
                          "process_index": trainer.accelerator.process_index})
            return out

    rollout = Recorded(ENV_ID, tokenizer, env_kwargs={"fail_marker": "FAULT"}, generate=scripted,
                       failed_group="drop", group_rubric=GroupRubric([("size", size)], combine="replace"),
                       max_workers=2)
    output_dir = tempfile.mkdtemp(prefix=f"benchmax-trl-ddp{rank}-", dir=out_dir)
    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=3, num_generations=2,
                      max_completion_length=2048, max_steps=2, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=rollout.reward, args=args,
                          train_dataset=rollout.dataset(6), rollout_func=rollout, processing_class=tokenizer)
    trainer.train()
    rollout.close()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(calls))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
