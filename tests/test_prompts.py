"""The prompt check (issue 11, items 4 and 5): every prompt template, rendered by the loop for every step x arch
(sm_75, sm_80, sm_86, sm_89, sm_90) x dtype (fp16, bf16, fp32), is free of the package's internal names, states
every field the reply must hold, carries the target's rules its step needs, and stays within its size budget.

The opening prompts come from the real layers (the language reference, the ABI header, the worked example); the
repair prompts from a scripted run through every repair against the fake layers (their feedback is the fakes'),
for the same real target."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loopback.fakes import FakeEnvironment, cuda, fenced, full_tl, make_store, manifest, sketch_tl

from flashgen import prompts
from flashgen.abi import KernelManifest
from flashgen.agent.loop import Budget, Loop, LoopConfig, run_loop
from flashgen.agent.providers import ScriptedProvider, Task
from flashgen.harness.environment import Environment
from flashgen.prompts.internal import find_internal, internal_names
from flashgen.targets import resolve_target
from flashgen.translators.params import choose_params
from flashgen.variant import DType, Variant

ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
DTYPES = ("fp16", "bf16", "fp32")
VARIANT = Variant(causal=True, softcap=30.0)
HEAD_DIM = 64
TEMPLATES = [n for n in prompts.names() if not n.startswith("_")]

# The size budget, in characters (about 4 to a token), measured at d64. The translate prompt is the big one, and
# most of it is the worked example: 37.1k (sm_80 family), 42.6k to 43.4k (sm_75) and 45.0k (sm_90 bf16/fp16: its
# CUDA is 40.8k since the producer hands the consumers each tile's note, session 19) characters, of which the CUDA
# is 34.1k to 40.8k, the TL 2.2k to 2.9k and the manifest 0.7k to 1.1k. It is what a model adapts (both kernels of
# the trial were), so it is kept whole, with a budget of its own: 46k. All the rest of the step (the task,
# the ABI header, the manifest's fields, the rules, the program to translate) is 9.7k to 11.1k: 12k. So an opening
# translate prompt stays under 58k characters (~14.5k tokens); with the two repair
# rounds a conversation keeps (each a reply about the size of the example's CUDA, ~10k tokens, plus its feedback)
# and the next reply, a translate request needs ~46k tokens of context: inside a 64k-token model, a quarter of
# Claude's 200k, far from GPT-4.1's 1M. The sketch and params prompts are mostly the language reference, cut to
# the task (16k to 18k characters; 25k to 28k on sm_90 fp16/bf16, which adds the Hopper dataflow): 32k. A repair
# prompt is its feedback plus a few lines of request and rules: 4k with the fakes' short feedback.
EXAMPLE_BUDGET = 46_000
TRANSLATE_REST_BUDGET = 12_000
TL_STEP_BUDGET = 32_000
REPAIR_BUDGET = 4_000

# what each prompt must ask for: the fenced blocks the loop extracts (flashgen.agent.extract), and the full
# program's header lines; the translate step's manifest fields are checked against the schema below
ASKS = {
    "system": ["```tl", "```cuda", "```json"],
    "sketch": ["```tl"],
    "params": ["one ```tl block", "`Target`", "`Variant`", "`Params`"],
    "translate": ["one ```cuda block", "one ```json block"],
    "repair_syntax": ["one ```tl block"],
    "repair_check": ["one ```tl block"],
    "repair_interpret": ["one ```tl block"],
    "repair_slow": ["one ```tl block"],
    "repair_compile": ["one ```cuda block", "one ```json block"],
    "repair_wrong": ["one ```cuda block", "one ```json block"],
    "repair_no_code": ["one fenced block tagged ```"],
    "repeated": ["I ask once more", "The request was:"],
}


def _manifest_fields(model=KernelManifest):
    for name, field in model.model_fields.items():
        yield name
        args = (field.annotation, *getattr(field.annotation, "__args__", ()))
        inner = next((a for a in args if hasattr(a, "model_fields")), None)
        if inner is not None:
            yield from _manifest_fields(inner)


def _task(arch: str, dtype: str) -> Task:
    target = resolve_target(arch)
    return Task(variant=VARIANT, target=target.name, arch=arch, dtype=DType(dtype), head_dim=HEAD_DIM)


def opening_prompts(arch: str, dtype: str) -> dict[str, str]:
    """The three opening prompts as the loop renders them from the real layers."""
    task, env = _task(arch, dtype), Environment()
    target = env.target(task.target)
    loop = Loop(LoopConfig(task=task), ScriptedProvider([]), env, trace=None)
    loop.state.sketch = env.library_tl(VARIANT, target, task.dtype, HEAD_DIM, form="sketch")
    loop.state.tl = env.library_tl(VARIANT, target, task.dtype, HEAD_DIM, form="full",
                                   params=dict(choose_params(VARIANT, target, task.dtype, HEAD_DIM)))
    return {phase: loop._opening_prompt(phase) for phase in ("sketch", "params", "translate")}


def _bad_manifest() -> str:
    return json.dumps({**manifest().model_dump(mode="json"), "variant": "causal"})


def repair_prompts(arch: str, dtype: str, store_dir: Path) -> dict[str, list[str]]:
    """Every template the loop renders on a scripted run through every repair (fake layers, the real target), in
    the order rendered."""
    rendered: dict[str, list[str]] = {}
    real = prompts.render

    def spy(name, **context):
        text = real(name, **context)
        rendered.setdefault(name, []).append(text)
        return text

    prompts.render = spy
    try:
        return _run_every_repair(arch, dtype, store_dir, rendered)
    finally:
        prompts.render = real


def _run_every_repair(arch: str, dtype: str, store_dir: Path, rendered: dict[str, list[str]]) -> dict[str, list[str]]:
    def reply(cuda_extra="", manifest_text=None, time_ms=1.0):
        return fenced("cuda", cuda(cuda_extra, time_ms)) + "\n```json\n" + (
            manifest_text or manifest().model_dump_json()) + "\n```\n"

    script = [
        fenced("tl", sketch_tl("  SYNTAX_ERROR\n")),  # repair_syntax
        "I will think about it.",  # repair_no_code
        fenced("tl", sketch_tl()),
        fenced("tl", sketch_tl()),  # a sketch where a full program belongs: repair_check
        fenced("tl", full_tl(extra="  WRONG_MASK\n")),  # repair_interpret
        fenced("tl", full_tl()),
        reply("COMPILE_ERROR;"),  # repair_compile (the build)
        reply("COMPILE_ERROR;"),  # the same again: repeated
        reply(manifest_text=_bad_manifest()),  # repair_compile (the manifest)
        reply("WRONG_KERNEL;"),  # repair_wrong
        reply(time_ms=2.0),  # correct, slower than the baseline: repair_slow
        fenced("tl", full_tl({"BLOCK_M": 128, "BLOCK_N": 64})),
        reply(time_ms=0.5),
    ]
    result = run_loop(LoopConfig(task=_task(arch, dtype), budget=Budget(max_iters=len(script))),
                      ScriptedProvider(script), env=FakeEnvironment(gpu=True), store=make_store(store_dir))
    assert result.status == "done", result.reason
    for opening in ("sketch", "params", "translate"):  # the fakes' openings; the real ones are checked above
        rendered.pop(opening, None)
    return rendered


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_prompt_is_free_of_internal_names_asks_for_every_field_and_fits(arch, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))  # no tuned file of this machine's user
    openings = opening_prompts(arch, dtype)
    rendered = {name: [text] for name, text in openings.items()}
    rendered.update(repair_prompts(arch, dtype, tmp_path))
    assert sorted(rendered) == sorted(TEMPLATES), "a template the check does not reach"
    fields = list(_manifest_fields())
    for name, texts in rendered.items():
        for text in texts:
            assert find_internal(text) == [], (name, arch, dtype)
            flat = " ".join(text.split())
            for asked in ASKS[name]:
                assert asked in flat, (name, asked)
            assert "\n\n\n" not in text, name
    translate = openings["translate"]
    for field in fields:
        assert f"- `{field}`: " in translate, field
    example = translate[translate.index("## A worked example"):translate.index("## The program to translate")]
    assert len(example) <= EXAMPLE_BUDGET, len(example)
    assert len(translate) - len(example) <= TRANSLATE_REST_BUDGET, len(translate) - len(example)
    for phase in ("sketch", "params"):
        assert len(openings[phase]) <= TL_STEP_BUDGET, (phase, len(openings[phase]))
    for name in ("repair_syntax", "repair_check", "repair_interpret", "repair_slow", "repair_compile",
                 "repair_wrong", "repair_no_code"):
        assert max(map(len, rendered[name])) <= REPAIR_BUDGET, name


def test_the_denylist_is_the_packages_own_names():
    names = internal_names()
    for internal in ("KernelPlan", "choose_params", "plan_for_variant", "flashgen.translators.plan",
                     "flashgen/translators/render", "fields_outline", "RunTrace", "TLBudgetError"):
        assert internal in names, internal
    for usable in ("FlashgenAttnParams", "FlashgenTensorMaps", "OnlineSoftmax", "workspace_floats", "smem_bytes",
                   "return_lse", "kv_group", "cdiv", "seqlen_q", "flashgen"):
        assert usable not in names, usable
    assert find_internal("built by `KernelPlan` (plan.py) via render(plan) and params.choose_params(...)") != []
    assert find_internal("see docs/translators.md") != []
    assert find_internal("```cuda\n__device__ void tile_fields() {}\n```\nuse tile_fields") == []  # shown: usable


@pytest.mark.parametrize("arch, dtype, step, says", [
    # the T4 trial: the conversion rule, and that register tiles stay bf16, at the params step already
    ("sm_75", "bf16", "params", ["as scaled fp16", "register operand tiles (Q_r, P_r) are **bf16**",
                                 "one K/V buffer"]),
    ("sm_75", "bf16", "sketch", ["as scaled fp16"]),
    ("sm_75", "bf16", "translate", ["2^(e_q + e_k)", "no cp.async"]),
    ("sm_75", "fp16", "params", ["one K/V buffer"]),
    ("sm_80", "bf16", "params", ["take bf16 directly", "`as scaled fp16` is rejected"]),
    ("sm_86", "fp32", "params", ["tf32"]),
    ("sm_89", "fp16", "translate", ["cp.async", "mma.sync.aligned.m16n8k16"]),
    ("sm_90", "bf16", "translate", ["FlashgenTensorMaps maps", '"arch": "sm_90a"', "wgmma"]),
    ("sm_90", "fp32", "translate", ["cvt.rna.tf32.f32"]),
])
def test_each_step_gets_the_rules_of_its_target(arch, dtype, step, says, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    text = opening_prompts(arch, dtype)[step]
    rules = text[text.index(f"## Rules for {arch} / {dtype}"):]
    for words in says:
        assert words in rules, words
    if step != "translate":  # the 48 KB opt-in is the harness's business: said where the CUDA is written
        assert "cudaFuncAttributeMaxDynamicSharedMemorySize" not in text
    else:
        assert "more than 48 KB works" in rules and "NAME is yours to choose" in text
