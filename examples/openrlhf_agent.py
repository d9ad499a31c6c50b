"""OpenRLHF agent file for benchmax/Math-v0: pass it as ``--train.agent_func_path``.

    python examples/make_dataset.py openrlhf benchmax/Math-v0 data/math.jsonl 2000
    python -m openrlhf.cli.train_ppo_ray --train.agent_func_path examples/openrlhf_agent.py \\
        --data.prompt_data data/math.jsonl --data.input_key prompt --data.label_key label ...

(see examples/README.md for a whole command line).
"""

from benchmax_gym.adapters.openrlhf import make_executor

AgentExecutor = make_executor("benchmax/Math-v0", max_turns=4)
