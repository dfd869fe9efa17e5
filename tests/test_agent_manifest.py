"""The translate step as a real model meets it (issue 11, items 1-3): a repair that changes only the manifest is a
new attempt, an identical reply is asked about once more before the run stops, the manifest is defined in the
prompt from the pydantic model itself, and a wrong manifest is reported as the manifest's fault, field by field."""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import FakeEnvironment, cuda, fenced, full_tl, make_store, manifest, sketch_tl

from flashgen.abi import KernelManifest
from flashgen.agent.loop import Budget, Loop, LoopConfig, run_loop
from flashgen.agent.providers import ScriptedProvider, Task
from flashgen.variant import DType, Variant

TASK = Task(variant=Variant(causal=True), target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
SKETCH, FULL = fenced("tl", sketch_tl()), fenced("tl", full_tl())


def reply(manifest_data: dict, extra: str = "") -> str:
    return fenced("cuda", cuda(extra)) + "\n```json\n" + json.dumps(manifest_data, indent=1) + "\n```\n"


GOOD = manifest(Variant(causal=True)).model_dump(mode="json")
BAD = {**GOOD, "variant": "causal"}  # what the model sent: the variant's name, not the object


def run(replies, tmp_path, **budget):
    provider = ScriptedProvider(replies)
    result = run_loop(LoopConfig(task=TASK, budget=Budget(**budget)), provider, env=FakeEnvironment(),
                      store=make_store(tmp_path))
    return result, provider


def test_a_repair_that_changes_only_the_manifest_is_a_new_attempt(tmp_path):
    result, provider = run([SKETCH, FULL, reply(BAD), reply(GOOD)], tmp_path)
    assert provider.requests[3].stage == "repair_compile"
    assert result.status == "done", result.reason
    assert result.best is not None and result.best.manifest.variant == Variant(causal=True)


def test_an_identical_repair_reply_is_asked_once_more_then_the_run_stops(tmp_path):
    # asked once more, saying so; the third answer fixes it
    result, provider = run([SKETCH, FULL, reply(BAD), reply(BAD), reply(GOOD)], tmp_path)
    assert result.status == "done", result.reason
    again = provider.requests[4]
    assert again.stage == "repair_compile" and "same as your previous one" in again.messages[-1].content
    assert "`variant`" in again.messages[-1].content  # the original feedback is repeated with it
    # the same reply a third time: the run stops, saying why
    result, provider = run([SKETCH, FULL, reply(BAD), reply(BAD), reply(BAD), reply(GOOD)], tmp_path)
    assert result.status == "failed" and len(provider.requests) == 5
    assert "twice with the same CUDA and manifest" in result.reason
    # the same CUDA after a compile error, but a different manifest (even though not asked for): a new attempt
    result, provider = run([SKETCH, FULL, reply(GOOD, "COMPILE_ERROR;"), reply({**GOOD, "notes": "x"}, "COMPILE_ERROR;"),
                            reply(GOOD)], tmp_path)
    assert result.status == "done" and "same as your previous one" not in provider.requests[4].messages[-1].content


def test_a_manifest_error_names_the_manifest_the_field_what_was_given_and_what_is_expected(tmp_path):
    bad = {**BAD, "launches": [{**GOOD["launches"][0], "threads": 2048}]}
    result, provider = run([SKETCH, FULL, reply(bad), reply(GOOD)], tmp_path)
    prompt = provider.requests[3].messages[-1].content
    assert "does not build" not in prompt and "http" not in prompt and "pydantic" not in prompt
    assert "Your manifest (the ```json block) is invalid" in prompt and "not the CUDA" in prompt
    assert ('- `variant`: Input should be a valid dictionary; given "causal"; expected object with the fields '
            + ", ".join(Variant.model_fields)) in prompt
    assert "- `launches.0.threads`: Input should be less than or equal to 1024; given 2048; expected int 32..1024" in prompt
    assert result.status == "done"
    result, provider = run([SKETCH, FULL, fenced("cuda", cuda()) + '\n```json\n{"name": \n```\n', reply(GOOD)], tmp_path)
    assert "- not valid JSON: Expecting value at line 2 column 1" in provider.requests[3].messages[-1].content


def _all_fields(model, prefix=""):
    for name, field in model.model_fields.items():
        yield name, field.description
        inner = getattr(field.annotation, "model_fields", None)
        if inner is None:  # list[Launch], list[TensorMapSpec]
            args = getattr(field.annotation, "__args__", ())
            inner_model = next((a for a in args if hasattr(a, "model_fields")), None)
        else:
            inner_model = field.annotation
        if inner_model is not None:
            yield from _all_fields(inner_model)


def test_the_translate_prompt_defines_the_manifest_from_the_model_and_shows_the_examples(tmp_path):
    _, provider = run([SKETCH, FULL, reply(GOOD)], tmp_path)
    prompt = provider.requests[2].messages[1].content
    fields = list(_all_fields(KernelManifest))
    assert {"causal", "kernel", "box_rows", "workspace_floats", "num_splits", "reference_tl", "notes"} <= {f for f, _ in fields}
    for name, description in fields:
        assert f"- `{name}`: " in prompt, name
        if description:
            assert description.split("\n")[0] in prompt, name
    example = manifest(Variant(causal=True)).model_dump(mode="json")
    assert "Its manifest:\n```json\n" + json.dumps(example, indent=1) + "\n```" in prompt


def test_the_real_translate_prompt_stays_within_its_size_budget():
    """The manifest's schema and worked example add about 2.6k characters to the prompt (the worked example's
    CUDA is most of it); the whole prompt's budget is tests/test_prompts.py's. The Hopper example's tensor maps and
    the launches' `when` and own maps (tiles per range of sizes) take it to about 4.1k there."""
    from flashgen.harness.environment import Environment
    from flashgen.targets import get_target

    env = Environment()
    started = time.monotonic()
    for name, arch in (("a100", "sm_80"), ("t4", "sm_75"), ("h200", "sm_90")):
        target = get_target(name)
        task = Task(variant=Variant(causal=True, softcap=30.0), target=name, arch=arch, dtype=DType.bf16, head_dim=64)
        loop = Loop(LoopConfig(task=task), ScriptedProvider([]), env, trace=None)
        loop.state.tl = env.library_tl(task.variant, target, task.dtype, 64, form="full",
                                       params=env.choose_params(task.variant, target, task.dtype, 64)[0])
        prompt = loop._opening_prompt("translate")
        schema_part = prompt[prompt.index("Besides the source"):prompt.index("## Rules for")]
        example_part = prompt[prompt.index("Its manifest:"):prompt.index("## The program to translate")]
        assert len(schema_part) + len(example_part) < 4_300, name
        assert len(prompt) < 64_000, (name, len(prompt))
    assert time.monotonic() - started < 60
