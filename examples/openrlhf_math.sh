#!/usr/bin/env bash
# GRPO on benchmax/Math-v0 with OpenRLHF's multi-turn agent executor (8 GPUs).
#   pip install 'benchmax-gym[openrlhf]'     (GPU machines: openrlhf builds flash-attn; see the README for CPU)
#   python examples/make_dataset.py openrlhf benchmax/Math-v0 data/benchmax-math
set -x
python -m openrlhf.cli.train_ppo_ray \
  --ref.num_nodes 1 --ref.num_gpus_per_node 8 \
  --actor.num_nodes 1 --actor.num_gpus_per_node 8 \
  --vllm.num_engines 4 --vllm.tensor_parallel_size 2 --vllm.gpu_memory_utilization 0.6 \
  --train.colocate_all \
  --actor.model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \
  --data.prompt_dataset data/benchmax-math/train.jsonl --data.input_key prompt --data.label_key label \
  --data.apply_chat_template \
  --train.agent_func_path "$(dirname "$0")/openrlhf_agent.py" \
  --algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 8 \
  --algo.dynamic_filtering_enable \
  --rollout.max_new_tokens 1024 --data.max_len 4096 \
  --ckpt.output_dir runs/openrlhf-math \
  "$@"
# --algo.dynamic_filtering_enable: a failed sample (a tool gone, a lost worker: reward NaN) drops its
# prompt's group, the only exclusion OpenRLHF's code has; its default range (0, 1) also drops groups
# whose samples all score the same (DAPO's filter), which carry no advantage under group_norm.
