#!/usr/bin/env bash
# GRPO on benchmax/Math-v0 with SkyRL (4 GPUs, colocated vLLM). From a SkyRL checkout:
#   python /path/to/benchmax-gym/examples/make_dataset.py skyrl benchmax/Math-v0 $HOME/data/benchmax-math
#   bash /path/to/benchmax-gym/examples/skyrl_math.sh
set -x
DATA_DIR="$HOME/data/benchmax-math"
NUM_GPUS=4
uv run --isolated --extra fsdp --with 'benchmax-gym[skyrl]' python "$(dirname "$0")/skyrl_main.py" \
  data.train_data="['$DATA_DIR/train.parquet']" \
  data.val_data="['$DATA_DIR/validation.parquet']" \
  trainer.algorithm.advantage_estimator="grpo" \
  trainer.algorithm.dynamic_sampling.type=filter \
  trainer.policy.model.path="Qwen/Qwen2.5-1.5B-Instruct" \
  trainer.placement.colocate_all=true \
  trainer.strategy=fsdp \
  trainer.placement.policy_num_gpus_per_node=$NUM_GPUS \
  trainer.placement.ref_num_gpus_per_node=$NUM_GPUS \
  generator.inference_engine.num_engines=$NUM_GPUS \
  generator.inference_engine.tensor_parallel_size=1 \
  trainer.epochs=20 \
  trainer.train_batch_size=256 \
  trainer.policy_mini_batch_size=64 \
  trainer.max_prompt_length=2048 \
  generator.sampling_params.max_generate_length=1024 \
  generator.max_turns=4 \
  generator.batched=false \
  generator.inference_engine.backend=vllm \
  generator.inference_engine.run_engines_locally=true \
  environment.env_class=benchmax \
  generator.n_samples_per_prompt=8 \
  trainer.logger="console" \
  "$@"
