"""Run in a fresh process by test_openrlhf.py: OpenRLHF's own ``train_ppo_ray`` entry point on
a launch script's argv (its argparse parser and every check it runs on the arguments), stopped
where training would start Ray; then the agent file it names, loaded by OpenRLHF's loader.

    python openrlhf_parse.py ARGV.json    # prints one JSON line
"""

import argparse
import ast
import importlib.util
import json
import os
import sys


def main(path):
    argv = json.loads(open(path).read())
    assert argv[:2] == ["-m", "openrlhf.cli.train_ppo_ray"], argv[:2]
    parsed = {}
    parse_args = argparse.ArgumentParser.parse_args

    def recording(self, *args, **kwargs):
        flags = [a.split("=")[0] for a in sys.argv[1:] if a.startswith("--")]
        unknown = [f for f in flags if f not in self._option_string_actions]  # abbreviations included
        assert not unknown, f"not options of train_ppo_ray (abbreviated or unknown): {unknown}"
        parsed.update(vars(parse_args(self, *args, **kwargs)))
        return argparse.Namespace(**parsed)

    class Started(Exception):
        pass

    def train(args):  # where the entry point starts Ray: the arguments passed every check
        raise Started

    # The entry point's own __main__ block (its parser and every check on the arguments), run
    # without the module's top-level imports (peft, deepspeed, vLLM: GPU installs).
    source = ast.parse(open(importlib.util.find_spec("openrlhf.cli.train_ppo_ray").origin).read())
    namespace = {"__name__": "__main__"}
    for node in source.body:  # the module's imports that need no GPU stack
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), "train_ppo_ray", "exec"), namespace)
            except ImportError:
                pass
    namespace["train"] = train
    block = next(node for node in source.body if isinstance(node, ast.If)
                 and ast.unparse(node.test) == "__name__ == '__main__'")
    argparse.ArgumentParser.parse_args = recording
    sys.argv = ["train_ppo_ray", *argv[2:]]
    try:
        exec(compile(ast.Module(body=block.body, type_ignores=[]), "train_ppo_ray.__main__", "exec"), namespace)
    except Started:
        pass
    else:
        raise AssertionError("train_ppo_ray's checks returned without starting training")
    # the agent file, loaded by OpenRLHF's own loader
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launch import stub_vllm

    with stub_vllm():  # (CPU) the loader's module imports vLLM
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    _load_agent_executor(parsed["train.agent_func_path"])
    print(json.dumps({k: v for k, v in parsed.items() if isinstance(v, (str, int, float, bool, type(None)))}))


if __name__ == "__main__":
    main(sys.argv[1])
