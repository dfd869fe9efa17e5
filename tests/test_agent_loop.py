"""The generate loop against fakes of the layers (tests/loopback/fakes.py) and real SDKs on a
loopback server. The real layers are exercised by tests/test_agent_real.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import (
    PARAMS,
    FakeEnvironment,
    cuda_reply,
    fenced,
    full_tl,
    make_store,
    sketch_tl,
)
from loopback.server import LoopbackServer

from flashgen.agent.loop import Budget, LoopConfig, resume_loop, run_loop
from flashgen.agent.outputs import write_outputs
from flashgen.agent.providers import OpenAIProvider, RetryPolicy, ScriptedProvider, Task
from flashgen.targets import get_target
from flashgen.variant import DType, Variant

TASK = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
SKETCH, FULL = fenced("tl", sketch_tl()), fenced("tl", full_tl())


def run(replies, tmp_path, gpu=False, budget=None, **config):
    env = FakeEnvironment(gpu=gpu)
    provider = ScriptedProvider(replies)
    result = run_loop(LoopConfig(task=TASK, budget=budget or Budget(), **config), provider, env=env,
                      store=make_store(tmp_path))
    return result, provider, env


def test_syntax_error_repaired_through_the_openai_sdk(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-loop-0123456789")
    with LoopbackServer() as server:
        server.push(SKETCH, fenced("tl", full_tl(extra="  SYNTAX_ERROR here\n")), FULL, cuda_reply())
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url, retry=RetryPolicy(base_delay_s=0))
        result = run_loop(LoopConfig(task=TASK), provider, env=FakeEnvironment(), store=make_store(tmp_path))
        repair_prompt = server.seen[2].body["messages"][-1]["content"]
    assert result.status == "done" and result.best is not None and result.iterations == 4
    assert "kernel.tl:6:3: unexpected 'SYNTAX_ERROR'" in repair_prompt and "```tl" in repair_prompt
    # the repair request carries the failed attempt, so the model sees what it wrote
    assert "SYNTAX_ERROR here" in server.seen[2].body["messages"][-2]["content"]
    assert result.tokens == 4 * 18 and result.cost_usd == pytest.approx(4 * (11 * 2.5 + 7 * 10) / 1e6)
    assert result.best.verification.ran is False and "did not run" in result.best.verification.summary


def test_compile_error_repaired(tmp_path):
    result, provider, env = run([SKETCH, FULL, cuda_reply("COMPILE_ERROR;"), cuda_reply()], tmp_path)
    assert result.status == "done" and "COMPILE_ERROR" not in result.best.cuda
    assert provider.requests[3].stage == "repair_compile"
    assert 'identifier "COMPILE_ERROR" is undefined' in provider.requests[3].messages[-1].content
    assert env.calls.count("build") == 2


def test_wrong_mask_caught_by_the_cpu_interpreter_never_reaches_the_gpu(tmp_path):
    result, provider, env = run([SKETCH, fenced("tl", full_tl(extra="  WRONG_MASK\n")), FULL, cuda_reply()],
                                tmp_path, gpu=True)
    assert result.status == "done" and result.best.verification.ok
    assert provider.requests[2].stage == "repair_interpret"
    assert "query rows 0..5" in provider.requests[2].messages[-1].content
    assert env.calls.count("verify") == 1  # only the corrected program was run on the (fake) GPU


def test_wrong_kernel_caught_by_the_gpu_verifier(tmp_path):
    result, provider, env = run([SKETCH, FULL, cuda_reply("WRONG_KERNEL;"), cuda_reply(time_ms=0.5)], tmp_path, gpu=True)
    assert result.status == "done" and result.best.verification.ok and result.best.timing.time_ms == 0.5
    assert provider.requests[3].stage == "repair_wrong"
    assert "query rows 0..15" in provider.requests[3].messages[-1].content


def test_replies_without_code_get_a_bounded_number_of_repairs(tmp_path):
    result, provider, _ = run([SKETCH, "Sure! I will write it.", FULL, cuda_reply()], tmp_path)
    assert result.status == "done" and provider.requests[2].stage == "repair_no_code"
    result, provider, _ = run([SKETCH] + ["I'd rather not."] * 5, tmp_path, max_no_code=2)
    assert result.status == "failed" and "no usable tl code" in result.reason and result.best is None
    assert len(provider.requests) == 4  # sketch + 3 replies without code (2 tolerated)
    truncated = "```tl\nTarget sm_80\nKernel attn\n  Copy Q from global to shared\n"
    result, provider, _ = run([SKETCH, truncated, FULL, cuda_reply()], tmp_path)
    assert result.status == "done" and "cut off" in provider.requests[2].messages[-1].content or \
        "truncated" in provider.requests[2].messages[-1].content


def test_a_slow_kernel_s_compiler_warnings_reach_the_speed_repair(tmp_path):
    """A kernel that builds with a ptxas warning (serialized wgmma: 20-30 % on a Hopper kernel, and no error) is
    correct but slow; the speed repair shows the model the warning, and a clean build's shows none."""
    replies = [SKETCH, FULL, cuda_reply("SERIALIZED_WGMMA;", time_ms=3.0), fenced("tl", full_tl(PARAMS[1])),
               cuda_reply(time_ms=2.0), fenced("tl", full_tl(PARAMS[2])), cuda_reply(time_ms=2.5)]
    _, provider, _ = run(replies, tmp_path, gpu=True, budget=Budget(max_iters=7))
    slow = [r.messages[-1].content for r in provider.requests if r.stage == "repair_slow"]
    assert len(slow) >= 2
    assert "Compiler warnings on this build" in slow[0] and "[C7520]" in slow[0] and "serialized" in slow[0]
    assert "Compiler warnings" not in slow[1]


def test_budget_exhausted_keeps_the_fastest_correct_kernel(tmp_path):
    # correct but slower than the baseline (1 ms): timing feedback, new parameters, until the budget ends
    replies = [SKETCH, FULL, cuda_reply(time_ms=3.0), fenced("tl", full_tl(PARAMS[1])), cuda_reply(time_ms=2.0),
               fenced("tl", full_tl(PARAMS[2])), cuda_reply(time_ms=2.5)]
    result, provider, _ = run(replies, tmp_path, gpu=True, budget=Budget(max_iters=7))
    assert result.status == "budget" and "iteration budget" in result.reason and "keeping the best" in result.reason
    assert result.best.timing.time_ms == 2.0 and "BLOCK_M=128 BLOCK_N=64" in result.best.tl
    assert provider.requests[3].stage == "repair_slow" and "sdpa_flash 1 ms" in provider.requests[3].messages[-1].content
    # a token budget stops it too
    result, _, _ = run(replies, tmp_path, gpu=True, budget=Budget(max_tokens=500))
    assert result.status == "budget" and "token budget" in result.reason and result.iterations == 3


class Crash(RuntimeError):
    pass


def test_crash_mid_run_then_resume_from_the_store(tmp_path):
    store = make_store(tmp_path)
    env = FakeEnvironment()
    replies = [SKETCH, fenced("tl", full_tl(extra="  SYNTAX_ERROR\n")), FULL, cuda_reply()]

    def crash(_request):
        raise Crash("killed after step 3")

    first = ScriptedProvider(replies[:3] + [crash])
    with pytest.raises(Crash):
        run_loop(LoopConfig(task=TASK), first, env=env, store=store, provider_info={"name": "scripted"})
    (run,) = store.runs()
    # the crash is recorded as the run's end, with the step and whether --resume can help (issue 12)
    assert run.status == "error" and "the translate step crashed: Crash: killed after step 3" in run.summary["reason"]
    assert run.summary["resume"]["helps"] and "repeats the step that crashed" in run.summary["resume"]["how"]
    run_id = str(run.id)
    second = ScriptedProvider(replies[3:])
    result = resume_loop(run_id, lambda info: second, env=env, store=store)
    assert result.status == "done" and result.iterations == 4
    assert [r.stage for r in second.requests] == ["translate"]  # continued, not restarted
    assert result.best.sketch == sketch_tl()


def test_no_api_key_reaches_the_store_or_the_files(tmp_path, monkeypatch):
    key = "sk-test-SECRET-abcdefghijklmnop"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    store = make_store(tmp_path)
    with LoopbackServer() as server:
        # a model that echoes the key back (as a leaked prompt might) must not get it persisted either
        server.push(SKETCH + f"\n(my key is {key})", FULL, cuda_reply(f"// {key}"))
        provider = OpenAIProvider("gpt-4o", base_url=server.openai_base_url)
        result = run_loop(LoopConfig(task=TASK), provider, env=FakeEnvironment(), store=store,
                          provider_info={"name": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"})
        assert server.seen[0].headers["authorization"] == f"Bearer {key}"  # it was used ...
    out = tmp_path / "out"
    write_outputs(result, TASK, get_target("a100"), FakeEnvironment(), out)
    found = [p for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert found == []  # ... and written nowhere
    assert (out / "kernel.cu").read_text().count("[REDACTED]") == 1
