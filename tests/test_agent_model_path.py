"""The model path as a real model meets it (issue 11, items 4-6 and the transcript), replayed over the loopback
model server (tests/loopback) with scripted replies: the arch's rules at the step that needs them, a translate
prompt without contradictions or internal names, a resume that says what it does and can go on with another
provider or model, and `runs show ID --transcript`. Items 1-3: tests/test_agent_manifest.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import FakeEnvironment, cuda, cuda_reply, fenced, full_tl, make_store, sketch_tl
from loopback.server import LoopbackServer, Scripted

from flashgen.agent.loop import Budget, LoopConfig, resume_loop, run_loop
from flashgen.agent.providers import RetryPolicy, ScriptedProvider, Task, make_provider
from flashgen.harness.environment import Environment
from flashgen.prompts.internal import find_internal
from flashgen.variant import DType, Variant

SKETCH, FULL = fenced("tl", sketch_tl()), fenced("tl", full_tl())


def cli(*args, home, timeout=120):
    env = {**os.environ, "FLASHGEN_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "flashgen", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=home.parent)


def loopback_provider(server, model="m"):
    return make_provider("openai-compatible", model, server.openai_base_url, retry=RetryPolicy(base_delay_s=0, max_attempts=1))


def user_messages(seen):
    return [m["content"] for request in seen for m in request.body["messages"] if m["role"] in ("user", "system")]


# ----------------------------------------------------------------------------- items 4 and 5: the prompts


def test_the_t4_conversion_rule_comes_at_the_params_step_and_the_translate_prompt_is_clear(tmp_path, monkeypatch):
    """The issue's T4 trial (bf16, d128, causal, window 128): the model made its register tiles fp16; the params
    prompt now says they stay bf16, and the checker's complaint comes back with the rule restated."""
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    env = Environment()
    target = env.target("t4")
    variant = Variant(causal=True, window=128)
    task = Task(variant=variant, target="t4", arch="sm_75", dtype=DType.bf16, head_dim=128)
    sketch = env.library_tl(variant, target, task.dtype, 128, form="sketch")
    good = env.library_tl(variant, target, task.dtype, 128, form="full", params=env.choose_params(
        variant, target, task.dtype, 128)[0])
    fp16_registers = "\n".join(line.replace("dtype bf16", "dtype fp16") if " in register " in line else line
                               for line in good.splitlines()) + "\n"
    assert fp16_registers != good
    with LoopbackServer() as server:
        server.push(fenced("tl", sketch), fenced("tl", fp16_registers), fenced("tl", good))
        result = run_loop(LoopConfig(task=task, budget=Budget(max_iters=4)), loopback_provider(server), env=env,
                          store=make_store(tmp_path))
        seen = list(server.seen)
    assert result.status == "error" and len(seen) == 4  # the 4th request (translate) met the empty script
    params = seen[1].body["messages"][-1]["content"]
    assert "register operand tiles (Q_r, P_r) are **bf16**" in params and "as scaled fp16" in params
    repair = seen[2].body["messages"][-1]["content"]
    assert "register tensor of dtype fp16 in a bf16 program" in repair  # the real checker's line
    assert "register operand tiles (Q_r, P_r) stay bf16" in repair  # and the rule, restated
    translate = seen[3].body["messages"][-1]["content"]
    # item 5: the entry name is the model's, said once; the harness's 48 KB opt-in is said
    assert "NAME is yours to choose" in translate and "Each TL `Kernel` becomes an entry point NAME" not in translate
    assert "more than 48 KB works, up to 64 KB per block on NVIDIA T4" in translate
    # no internal names in anything sent (the system prompt, the openings, the repair)
    for content in user_messages(seen):
        assert find_internal(content) == []
    for word in ("KernelPlan", "plan.py", "render(plan)", "choose_params"):
        assert word not in translate


# ----------------------------------------------------------------------------- item 6: resume


def test_a_run_refused_by_its_provider_resumes_with_another_model_recorded(tmp_path):
    home, out = tmp_path / "home", tmp_path / "k"
    generate = ["generate", "--gpu", "a100", "--head-dim", "64", "--provider", "openai-compatible"]
    with LoopbackServer(Scripted(status=404)) as refusing, LoopbackServer() as other:
        done = cli(*generate, "--model", "gone-model", "--base-url", refusing.openai_base_url, "--out", str(out),
                   home=home)
        assert done.returncode == 2 and "request refused (HTTP 404)" in done.stderr, done.stderr
        assert "--provider P --model M" in done.stderr  # the end says how to go on with another model
        other.push(Scripted(text="no code yet"))
        again = cli("generate", "--resume", "1", "--out", str(out), "--model", "m2", "--base-url",
                    other.openai_base_url, "--max-iters", "1", home=home)
        plan = next(line for line in again.stderr.splitlines() if line.startswith("resuming run 1"))
        assert plan == (f"resuming run 1 at iteration 1: the sketch step sends the opening sketch prompt to "
                        f"openai-compatible (m2) at {other.openai_base_url} (instead of openai-compatible (gone-model) "
                        f"at {refusing.openai_base_url})"), plan
        assert [s.body["model"] for s in other.seen] == ["m2"] and len(refusing.seen) == 1
        # the change is recorded: runs show says so, and a plain resume goes on with m2
        shown = cli("runs", "show", "1", home=home)
        assert "provider: openai-compatible (gone-model)\nprovider: openai-compatible (m2) from iteration 1 (a resume)" \
               in shown.stdout, shown.stdout
        other.push(SKETCH)
        cli("generate", "--resume", "1", "--out", str(out), "--max-iters", "2", home=home)
        assert [s.body["model"] for s in other.seen] == ["m2", "m2"]
        # the request m2 got is the one the refused model was sent
        assert other.seen[0].body["messages"] == refusing.seen[0].body["messages"]


def test_a_failed_run_goes_on_only_with_another_model_from_the_request_that_ended_it(tmp_path):
    store = make_store(tmp_path)
    task = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
    same = fenced("tl", full_tl(extra="  WRONG_MASK\n"))
    result = run_loop(LoopConfig(task=task), ScriptedProvider([SKETCH, same, same, same]), env=FakeEnvironment(),
                      store=store)
    assert result.status == "failed" and "twice with the same" in result.reason
    assert result.resume["helps"] and "--provider P --model M" in result.resume["how"]
    said = []
    unchanged = ScriptedProvider([FULL])
    again = resume_loop(result.run_id, lambda info: unchanged, env=FakeEnvironment(), store=store, progress=said.append)
    assert again.status == "failed" and unchanged.requests == []
    assert "resuming with the same provider would repeat its replies" in said[0]
    other = ScriptedProvider([FULL, cuda_reply()], model="other")
    made = []
    again = resume_loop(result.run_id, lambda info: made.append(info) or other, env=FakeEnvironment(), store=store,
                        provider={"name": "scripted", "model": "other"}, progress=said.append)
    assert again.status == "done", again.reason
    assert made[0]["model"] == "other" and [m for m in said if m.startswith("resuming")][-1] == (f"resuming run {result.run_id} at iteration 5: the "
                                                        "repair_interpret step sends the request the run stopped at to "
                                                        "scripted (other) (instead of scripted (scripted))")
    asked = other.requests[0].messages
    assert asked[-1].role == "user" and "same as your previous one" in asked[-1].content  # the request that ended it
    assert [m.role for m in asked].count("assistant") == 2  # the conversation as it was, less the reply that ended it


# ----------------------------------------------------------------------------- the transcript


def test_runs_show_transcript_prints_the_conversation_bounded_and_markup_free(tmp_path):
    store = make_store(tmp_path)
    task = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
    huge = "[bold]not markup[/bold] " + "x" * 50_000 + " THE END"
    with LoopbackServer() as server:
        server.push(SKETCH, fenced("tl", full_tl(extra="  SYNTAX_ERROR\n"), prose=huge), FULL,
                    fenced("cuda", cuda()) + "\n```json\n" + json.dumps({"name": "x"}) + "\n```\n")
        result = run_loop(LoopConfig(task=task, budget=Budget(max_iters=4)), loopback_provider(server),
                          env=FakeEnvironment(), store=store)
    assert result.status == "budget"
    home = store.home
    shown = cli("runs", "show", str(result.run_id), "--transcript", home=home)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    # the steps in order: prompts, replies with their model and tokens, the feedback
    order = ["run 1 generate [budget], provider openai-compatible (m)", "sketch · system", "sketch · prompt (sketch)",
             "[1] sketch · reply (sketch) · model m, 11 in + 7 out tokens", "the sketch TL was accepted",
             "params · prompt (params)", "[2] params · reply (params)", "not accepted: repair_syntax",
             "params · feedback (repair_syntax)", "unexpected 'SYNTAX_ERROR'", "[3] params · reply (repair_syntax)",
             "the params TL was accepted", "translate · prompt (translate)", "[4] translate · reply (translate)",
             "not accepted: repair_compile", "Your manifest (the ```json block) is invalid", "end: budget",
             "iteration budget spent", "resume: `flashgen generate --resume 1"]
    at = 0
    for piece in order:
        found = text.find(piece, at)
        assert found != -1, (piece, text[at:at + 3000])
        at = found
    assert "[bold]not markup[/bold]" in text and "THE END" in text  # literal, and the tail kept
    assert "characters left out of" in text and "x" * 10_000 not in text  # bounded
    full = cli("runs", "show", "1", "--transcript", "--max-chars", "0", home=home)
    assert "x" * 50_000 in full.stdout
    refused = cli("runs", "show", "1", "--json", "--transcript", home=home)
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1] == \
           "error: give --transcript or --json, not both"
