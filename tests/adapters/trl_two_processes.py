"""One process of a real two-process GRPOTrainer run on CPU (gloo), launched by
``test_trl_group.py`` and ``test_trl_failures.py``: ``python trl_two_processes.py OUT_DIR`` with
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` set. The process group meets through a file (no TCP
store), gloo's own sockets on the loopback interface only.

Two GRPO steps through :class:`TRLRollout` (``failed_group="drop"``, a group rubric scoring each
member with its group's size), ``num_generations=2``, ``per_device_train_batch_size=3``: TRL's
sampler gives process 0 prompts ``[a, a, b]`` and process 1 ``[b, c, c]``, so group ``b`` is
split between them. At the second step process 0's ``b`` sample fails (a tool backend lost).
Each process writes what its rollout_func got and returned to ``OUT_DIR/rank<k>.json``.

``python trl_two_processes.py OUT_DIR lockstep``: one GRPO step through :class:`TRLRollout` with
the trainer's own generation, which here does what TRL's vLLM server mode does: every call
gathers every process's prompts (a collective call) and hands each process the slice at
``process_index * len(prompts)``. Process 0's episodes make two calculator calls before answering,
process 1's answer at once. Each process writes its generation calls' prompt counts and its
episodes to ``OUT_DIR/lockstep<k>.json``.

``python trl_two_processes.py OUT_DIR failures``: six GRPO runs in which process 1 alone raises
where process 0 is on to a gather (the gloo timeout is 60 s). Outside generation
(:data:`BREAKS`, an env whose ``reset`` or ``step`` raises there): the trainer's own generation
with process 1's env raising in ``reset`` (process 0 is on to the first round's gather), a
generate of its own with process 1's env raising in ``step`` (the group gather), and
``environment_factory`` with process 1's env raising when ``Env.reward`` grades it (a group
rubric: its gather). Then a reward function of the user's, passed with the env's, raising (TRL's
gather of the rewards): with :class:`TRLRollout`, and with ``environment_factory`` at the second
step; and a record that cannot be pickled (:data:`UNSENDABLE`) sent to the group gather. After
each run each process writes what every run so far raised (its type, message and cause, or null)
to ``OUT_DIR/failures<k>.json``; the next run starts when both processes have ended this one.

``python trl_two_processes.py OUT_DIR environment_factory``: one GRPO step through
:func:`trl_environment` (Math-v0, a group rubric that scores each member with its group's size
and notes the tasks it saw), the same batch layout (group ``b`` split). Each process writes what
``Env.reward`` got and returned, and the groups its rubric scored, to ``OUT_DIR/env<k>.json``;
then the same for ``Env.reward`` called directly on the trainer's environments (no trainer)."""

import datetime
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # flaky.py


def main(out_dir: str, mode: str = "rollout") -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    timeout = {"timeout": datetime.timedelta(seconds=60)} if mode == "failures" else {}  # a hang: an error
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=world, **timeout)
    if mode == "failures":
        failures(out_dir, rank)
    elif mode == "environment_factory":
        environment_factory(out_dir, rank)
    elif mode == "lockstep":
        lockstep(out_dir, rank)
    else:
        rollout_func(out_dir, rank)
    dist.destroy_process_group()


def environment_factory(out_dir: str, rank: int) -> None:
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import trl_environment
    from benchmax_gym.core.group import GroupRubric
    from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen2.5")
    groups, calls = [], []

    def size(records):  # each member's score: how many members its group had
        groups.append([r["task_index"] for r in records])
        return [float(len(records))] * len(records)

    Env = trl_environment("benchmax/Math-v0", group_rubric=GroupRubric([("size", size)], combine="replace"))

    def env_reward(completions, environments=None, **kwargs):  # Env.reward, as TRL calls it, recorded
        out = Env.reward(completions, environments=environments, **kwargs)
        calls.append({"tasks": [e.env.unwrapped.episode.index for e in environments], "rewards": out,
                      "process_index": kwargs["log_metric"].__self__.accelerator.process_index})
        return out

    output_dir = tempfile.mkdtemp(prefix=f"benchmax-trl-env{rank}-", dir=out_dir)
    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=3, num_generations=2,
                      max_completion_length=8, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=env_reward, args=args,
                          train_dataset=Env.dataset(6), environment_factory=Env, processing_class=tokenizer)
    trainer.train()
    trained = list(groups)
    # called from your own code (no log_metric, so no num_generations): runs of one task in the
    # order gathered from both processes
    groups.clear()
    direct = Env.reward([[] for _ in trainer.environments], environments=trainer.environments)
    Path(out_dir, f"env{rank}.json").write_text(json.dumps({"calls": calls, "groups": trained,
                                                            "direct": direct, "direct_groups": groups}))


def lockstep(out_dir: str, rank: int) -> None:
    from accelerate.utils import broadcast_object_list, gather_object
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.testing.tokenizers import model_ids, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen")
    counts, turns = [], []
    calculator = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 2"}}</tool_call>'

    def reply(ids):  # this process's policy: on process 0, two calculator calls and then an answer
        sessions = [s for pool in rollout._sessions.values() for s in pool if s.input_ids == ids]
        if not sessions:  # not one of this process's episodes
            return [tokenizer.eos_token_id]
        done = len(sessions[0].episode.turn_rewards)
        return model_ids(sessions[0].chat, calculator if rank == 0 and done < 2 else "<answer>4</answer>")

    def server_mode(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        counts.append(len(prompt_ids))
        everyone = gather_object([(rank, [list(p) for p in prompt_ids])])
        answers = [None]
        broadcast_object_list(answers, from_process=0)  # (process 0 would answer every prompt here)
        sizes = {len(prompts) for _, prompts in everyone}
        mine = [reply(list(p)) for p in prompt_ids]
        if len(sizes) > 1:  # vLLM's server mode would hand this process another process's replies
            mine = [[tokenizer.eos_token_id]] * len(prompt_ids)
        return mine, None

    class Recorded(TRLRollout):
        def __call__(self, prompts, trainer):
            out = super().__call__(prompts, trainer)
            pool = [s for p in self._sessions.values() for s in p]
            turns.append([{"turns": len(s.episode.turn_rewards), "outcome": s.episode.outcome,
                           "reward": s.episode.reward} for s in pool])
            return out

    rollout = Recorded("benchmax/Math-v0", tokenizer, max_workers=2)
    output_dir = tempfile.mkdtemp(prefix=f"benchmax-trl-lockstep{rank}-", dir=out_dir)
    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=3, num_generations=2,
                      max_completion_length=2048, max_steps=1, report_to=[], use_cpu=True, logging_steps=1,
                      save_strategy="no", dataloader_num_workers=0)
    trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=rollout.reward, args=args,
                          train_dataset=rollout.dataset(6), rollout_func=rollout, processing_class=tokenizer)
    trainer._generate_single_turn = server_mode
    trainer.train()
    rollout.close()
    Path(out_dir, f"lockstep{rank}.json").write_text(json.dumps({"counts": counts, "episodes": turns}))


BREAKS = "benchmax-test/BreaksOnOneProcess-v0"
STORE_DOWN = {"down": False}  # the harness sets it once the datasets are built (they reset envs)


def _register_breaks() -> None:
    """:data:`BREAKS`: Math-v0 whose ``reset`` (``at="reset"``) or ``step`` raises on process
    ``rank`` only, once :data:`STORE_DOWN` (its task store unreachable from that host)."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    class Breaks(gym.Wrapper):
        def __init__(self, env, rank=1, at="reset"):
            super().__init__(env)
            self.broken, self.at = int(os.environ["RANK"]) == rank, at

        def reset(self, **kwargs):
            self._break("reset")
            return self.env.reset(**kwargs)

        def step(self, action):
            self._break("step")
            return self.env.step(action)

        def _break(self, call):
            if self.broken and self.at == call and STORE_DOWN["down"]:
                raise ConnectionError(f"{call}: the task store at 10.0.0.7 is unreachable")

    if BREAKS not in gym.registry:
        gym.register(BREAKS, entry_point=lambda rank=1, at="reset", **kwargs: Breaks(
            gym.make("benchmax/Math-v0", **kwargs), rank, at), disable_env_checker=True)


def _train(out_dir, rank, raised, name, generation=None, max_steps=1, **kwargs):
    """One GRPO run with :data:`STORE_DOWN` set, what it raised (type, message, cause; or None)
    in ``raised[name]`` and ``failures<rank>.json``; returns once both processes have ended it."""
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix=f"benchmax-trl-{name}{rank}-", dir=out_dir),
                      per_device_train_batch_size=3, num_generations=2, max_completion_length=64, max_steps=max_steps,
                      report_to=[], use_cpu=True, logging_steps=1, save_strategy="no", dataloader_num_workers=0)
    processing = tiny_tokenizer("qwen2.5" if "environment_factory" in kwargs else "qwen")  # (TRL parses calls)
    trainer = GRPOTrainer(model=tiny_model(processing), args=args, processing_class=processing, **kwargs)
    if generation is not None:
        trainer._generate_single_turn = generation
    STORE_DOWN["down"] = True
    try:
        trainer.train()
        raised[name] = None
    except Exception as exc:  # noqa: BLE001  (what the test reads)
        raised[name] = {"type": type(exc).__name__, "message": str(exc),
                        "cause": None if exc.__cause__ is None else str(exc.__cause__)}
    STORE_DOWN["down"] = False
    Path(out_dir, f"failures{rank}.json").write_text(json.dumps(raised))  # (a later run may hang)
    Path(out_dir, f"{name}.{rank}").touch()  # both processes start the next run together (no collective:
    deadline = time.monotonic() + 100      # on the previous code process 0 is still at a gather)
    while not all(Path(out_dir, f"{name}.{r}").exists() for r in range(2)) and time.monotonic() < deadline:
        time.sleep(0.1)


UNSENDABLE = "benchmax-test/UnsendableRecord-v0"


def _register_unsendable(rank: int) -> None:
    """:data:`UNSENDABLE`: Math-v0 whose ``episode_record`` holds a lock on process 1 (a user's env
    keeping a handle in its record), once :data:`STORE_DOWN`."""
    import gymnasium as gym

    def unsendable(**kwargs):
        env = gym.make("benchmax/Math-v0", **kwargs)
        record = env.unwrapped.episode_record
        if rank == 1:
            def with_trace():
                return {**record(), "trace": threading.Lock()} if STORE_DOWN["down"] else record()
            env.unwrapped.episode_record = with_trace
        return env

    if UNSENDABLE not in gym.registry:
        gym.register(UNSENDABLE, entry_point=unsendable, disable_env_checker=True)


def failures(out_dir: str, rank: int) -> None:
    from accelerate.utils import gather_object

    from benchmax_gym.adapters.trl import TRLRollout, trl_environment
    from benchmax_gym.core.group import GroupRubric
    from benchmax_gym.testing.tokenizers import model_ids, tiny_tokenizer

    _register_breaks()
    _register_unsendable(rank)
    tokenizer = tiny_tokenizer("qwen")
    raised = {"judge_calls": []}

    def server_mode(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        gather_object([len(prompt_ids)])  # collective, as vLLM's server mode is
        return [model_ids(rollout.chat, "<answer>4</answer>")] * len(prompt_ids), None

    def scripted(trainer, sessions):
        return [model_ids(s.chat, "<answer>4</answer>") for s in sessions], [None] * len(sessions)

    def size(records):
        return [float(len(records))] * len(records)

    def judge(completions, trainer_state, **kwargs):  # environment_factory: it breaks at the second step
        step = trainer_state.global_step
        raised["judge_calls"].append({"environments": "environments" in kwargs, "step": step})
        if rank == 1 and STORE_DOWN["down"] and ("environments" not in kwargs or step >= 1):
            raise ConnectionError("the judge at 10.0.0.7 is unreachable")
        return [0.5] * len(completions)

    def train(name, **kwargs):
        _train(out_dir, rank, raised, name, generation=server_mode if "rollout_func" in kwargs else None, **kwargs)

    rollout = TRLRollout(BREAKS, tokenizer, env_kwargs={"at": "reset"}, max_workers=2)
    train("reset", reward_funcs=rollout.reward, train_dataset=rollout.dataset(6), rollout_func=rollout)
    rollout.close()
    rollout = TRLRollout(BREAKS, tokenizer, env_kwargs={"at": "step"}, generate=scripted, max_workers=2)
    train("step", reward_funcs=rollout.reward, train_dataset=rollout.dataset(6), rollout_func=rollout)
    rollout.close()
    Env = trl_environment(BREAKS, group_rubric=GroupRubric([("size", size)], combine="replace"), at="step")
    train("reward", reward_funcs=Env.reward, train_dataset=Env.dataset(6), environment_factory=Env)
    rollout = TRLRollout("benchmax/Math-v0", tokenizer, generate=scripted, max_workers=2)
    train("judge", reward_funcs=[rollout.reward, judge], train_dataset=rollout.dataset(6), rollout_func=rollout)
    rollout.close()
    Env = trl_environment("benchmax/Math-v0")
    train("env_judge", max_steps=2, reward_funcs=[Env.reward, judge], train_dataset=Env.dataset(12),
          environment_factory=Env)
    rollout = TRLRollout(UNSENDABLE, tokenizer, generate=scripted, max_workers=2,
                         group_rubric=GroupRubric([("size", size)], combine="replace"))
    train("unsendable", reward_funcs=rollout.reward, train_dataset=rollout.dataset(6), rollout_func=rollout)
    rollout.close()


def rollout_func(out_dir: str, rank: int) -> None:
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


if __name__ == "__main__":
    main(*sys.argv[1:])
