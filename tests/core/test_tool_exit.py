"""A tool that calls ``sys.exit()`` (argparse or click given a model's bad arguments) fails its call;
it ended the process that stepped the env: a training run, an eval."""

import asyncio
import subprocess
import sys
import textwrap


def test_a_tool_that_calls_sys_exit_fails_its_call_and_the_process_goes_on(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent('''
        import asyncio, sys
        import gymnasium as gym
        import benchmax_gym  # noqa: F401
        from benchmax_gym import register_tool_env, tool

        def in_a_thread(code: int) -> str:
            """Exit.

            Args:
                code: exit code
            """
            sys.exit(code)

        @tool(inline=True)
        def inline(code: int) -> str:
            """Exit.

            Args:
                code: exit code
            """
            sys.exit(code)

        async def coroutine(code: int) -> str:
            """Exit.

            Args:
                code: exit code
            """
            await asyncio.sleep(0)
            sys.exit(code)

        register_tool_env("exits/Tools-v0", tools=[in_a_thread, inline, coroutine],
                          tasks=[{"prompt": "p", "answer": "a"}], rubric=[lambda completion: 0.0])
        env = gym.make("exits/Tools-v0")
        call = '<tool_call>{{"name": "{}", "arguments": {{"code": 3}}}}</tool_call>'.format

        async def steps():
            env.reset(seed=0)
            return [await env.unwrapped.astep(call(name)) for name in ("in_a_thread", "inline", "coroutine")]

        env.reset(seed=0)
        results = [env.step(call(name)) for name in ("in_a_thread", "inline", "coroutine")]
        results += asyncio.run(steps())
        for obs, reward, terminated, truncated, info in results:
            assert "exited (sys.exit(3))" in obs and info["error"] == "tool_error", obs
            assert not terminated and not truncated
        print("ALIVE")
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ALIVE" in done.stdout, done.stdout + done.stderr
