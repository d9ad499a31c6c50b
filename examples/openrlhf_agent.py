"""OpenRLHF agent file for benchmax/Math-v0: pass it as ``--train.agent_func_path``.

    python examples/make_dataset.py openrlhf benchmax/Math-v0 data/benchmax-math
    bash examples/openrlhf_math.sh      # --train.agent_func_path examples/openrlhf_agent.py ...
"""

from benchmax_gym.adapters.openrlhf import make_executor

AgentExecutor = make_executor("benchmax/Math-v0", max_turns=4)
