import subprocess
import sys

import pytest


def flashgen(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "flashgen.cli", "generate", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


@pytest.mark.parametrize("args, message", [
    (["--gpu", "nosuchgpu"], "unknown GPU 'nosuchgpu'"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--window", "64"], "a sliding window implies causal=True"),
    (["--norm", "tanh"], "unknown norm 'tanh'"),
    (["--kv-heads", "3", "--heads", "8"], "--heads 8 is not a multiple of --kv-heads 3"),
    (["--provider", "openai-compatible", "--model", "m"], "needs --base-url"),
    (["--resume", "abc", "--out", "x"], "bad run id 'abc'"),
])
def test_bad_input_is_one_line_and_non_zero(args, message, tmp_path):
    import os

    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    done = flashgen(*args, env=env, cwd=tmp_path)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_missing_sdk_key_is_one_line(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"} | {"FLASHGEN_HOME": str(tmp_path)}
    done = flashgen("--provider", "anthropic", env=env, cwd=tmp_path)
    assert done.returncode != 0 and "ANTHROPIC_API_KEY" in done.stderr and "Traceback" not in done.stderr
