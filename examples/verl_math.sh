#!/usr/bin/env bash
# GRPO on benchmax/Math-v0 with verl's agent loop (8 GPUs, vLLM async rollout).
#   pip install 'benchmax-gym[verl]'
#   python examples/make_dataset.py verl benchmax/Math-v0 $HOME/data/benchmax-math
set -x
DATA_DIR="$HOME/data/benchmax-math"
python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=benchmax_grpo \
  data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/validation.parquet" \
  data.train_batch_size=256 data.max_prompt_length=2048 data.max_response_length=2048 \
  data.return_raw_chat=True \
  actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.agent.default_agent_loop=benchmax \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$(dirname "$0")/verl_agent_loops.yaml" \
  +ray_kwargs.ray_init.runtime_env.env_vars.PYTHONSTARTUP="" \
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=benchmax_gym.adapters.verl \
  trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_epochs=20 trainer.logger='["console"]' \
  "$@"
# The rows name agent_name "benchmax"; verl_agent_loops.yaml registers it in each agent-loop worker
# (a fresh process: its _target_ imports benchmax_gym.adapters.verl there).
# benchmax_grpo (GRPO over each group's scored trajectories: a failed one, reward NaN, is out of
# its group's baseline) lives in benchmax_gym.adapters.verl, which verl's driver never imports.
# verl imports the modules named in VERL_USE_EXTERNAL_MODULES whenever `verl` is imported; the
# runtime_env sets it in every Ray worker, the TaskRunner that computes advantages included.
