"""verl: a group rubric that fails for a group is a failure there, never a reward, and the trainer
says so. The advantage step runs as verl's ``compute_advantage`` runs a registered estimator, and
the step's metrics come from verl's own ``compute_data_metrics``, as its trainer calls it."""

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from benchmax_gym.adapters.verl import register_group_estimator
from benchmax_gym.core.group import GroupRubric, best_of_k

RESPONSE, PROMPT = 4, 3


def moody_best_of_k(rewards):
    """best-of-k whose grader breaks on any group holding a 0.5 (a judge that raises)."""
    if 0.5 in rewards:
        raise ValueError("the judge could not compare these")
    return best_of_k(rewards)


def batch(scores, uids) -> DataProto:
    """A batch as verl's trainer holds it before its advantage step: each trajectory's score on its
    response's last token, ``uid`` naming its ``rollout.n`` group."""
    n = len(scores)
    rewards = torch.zeros(n, RESPONSE)
    rewards[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        tensors={"token_level_scores": rewards, "token_level_rewards": rewards.clone(),
                 "response_mask": torch.ones(n, RESPONSE, dtype=torch.int64),
                 "prompts": torch.ones(n, PROMPT, dtype=torch.int64),
                 "responses": torch.ones(n, RESPONSE, dtype=torch.int64),
                 "attention_mask": torch.ones(n, PROMPT + RESPONSE, dtype=torch.int64)},
        non_tensors={"uid": np.array(uids, dtype=object)})


def advantage_step(data: DataProto, estimator: str) -> DataProto:
    """ray_trainer.compute_advantage's call for a registered estimator (that module needs
    torchdata, not installed here)."""
    advantages, returns = get_adv_estimator_fn(estimator)(
        token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
        config=None, index=data.non_tensor_batch["uid"])
    data.batch["advantages"], data.batch["returns"] = advantages, returns
    return data


def test_a_group_its_rubric_fails_gets_advantage_0_and_the_steps_metrics_count_it(caplog):
    """Group ``b``'s rubric raises: its three trajectories get advantage 0 (HEAD trained them on
    their own rewards plus the 0 the failed component scored) and the step's metrics say
    ``benchmax/group_errors`` 3 (HEAD: only a log line); group ``a`` is scored as before. The next
    step, with no failure, says 0."""
    name = register_group_estimator(f"benchmax_test_moody_{uuid.uuid4().hex[:8]}",
                                    GroupRubric([("best", moody_best_of_k)], combine="add"))
    from verl.trainer.ppo.metric_utils import compute_data_metrics  # (as ray_trainer imports it)

    uids = ["a", "a", "a", "b", "b", "b"]
    data = advantage_step(batch([1.0, 0.0, 0.0, 0.5, 1.0, 0.0], uids), name)
    per_trajectory = data.batch["advantages"][:, -1]
    assert (per_trajectory[3:] == 0).all(), per_trajectory
    scored = torch.tensor([2.0, 0.0, 0.0])  # own reward + best-of-k
    assert torch.allclose(per_trajectory[:3], (scored - scored.mean()) / (scored.std() + 1e-6))
    metrics = compute_data_metrics(batch=data, use_critic=False)
    assert metrics["benchmax/group_errors"] == 3 and metrics["benchmax/group_errors/groups"] == 1, metrics
    assert "the judge could not compare these" in caplog.text

    data = advantage_step(batch([1.0, 0.0, 0.0, 0.25, 1.0, 0.0], uids), name)
    assert (data.batch["advantages"][3:, -1] != 0).all()
    assert compute_data_metrics(batch=data, use_critic=False)["benchmax/group_errors"] == 0


def test_the_count_reaches_verls_metrics_in_its_own_task_runner_process(tmp_path):
    """verl computes advantages and metrics in its TaskRunner, which imports this package only
    through ``VERL_USE_EXTERNAL_MODULES`` (here a user's module registering the estimator). There
    ``ray_trainer`` binds ``compute_data_metrics`` by name at its import: a fresh process that
    binds it the same way after ``import verl`` counts the failed group."""
    (tmp_path / "my_groups.py").write_text(textwrap.dedent("""
        from benchmax_gym.adapters.verl import register_group_estimator
        from benchmax_gym.core.group import GroupRubric

        def broken(rewards):
            raise RuntimeError("grader down")

        register_group_estimator("benchmax_broken_rank", GroupRubric([("rank", broken)]))
    """))
    here = Path(__file__).resolve().parent
    task_runner = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(here)!r})
        import verl
        from verl.trainer.ppo.metric_utils import compute_data_metrics
        from test_verl_group_errors import advantage_step, batch
        data = advantage_step(batch([1.0, 0.0], ["a", "a"]), "benchmax_broken_rank")
        metrics = compute_data_metrics(batch=data, use_critic=False)
        print(json.dumps({{"errors": metrics.get("benchmax/group_errors"),
                          "advantages": data.batch["advantages"][:, -1].tolist()}}))
    """)
    root = str(here.parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, str(tmp_path)]),
           "VERL_USE_EXTERNAL_MODULES": "benchmax_gym.adapters.verl,my_groups"}
    out = subprocess.run([sys.executable, "-c", task_runner], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"errors": 2.0, "advantages": [0.0, 0.0]}, result
