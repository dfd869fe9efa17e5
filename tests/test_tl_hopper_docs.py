"""The Hopper dataflow as taught: the language reference (two copies, equal), its example (the library's rendering),
the prompts (only for sm_90 fp16/bf16), and the one place its facts live (flashgen.targets.ROLE_DATAFLOW)."""

from pathlib import Path

import pytest

from flashgen import prompts
from flashgen.targets import ROLE_DATAFLOW, get_target
from flashgen.tl_spec import check, library, parse
from flashgen.variant import Variant

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "llm-tl.md"
COPY = ROOT / "flashgen" / "tl_spec" / "llm-tl.md"


def test_the_packaged_reference_is_the_docs_reference():
    assert COPY.read_text() == DOC.read_text(), "flashgen/tl_spec/llm-tl.md must be a copy of docs/llm-tl.md"


def test_the_hopper_example_is_the_library_rendering_and_checks():
    text = DOC.read_text()
    section = text[text.index("## Hopper dataflow"):]
    example = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4) + 1]
    want = library.render(Variant(causal=True, return_lse=True), dtype="bf16", arch="sm_90",
                          params={"BLOCK_M": 128, "BLOCK_N": 128, "WARPS": 8, "STAGES": 2}, name="causal")
    assert example == want
    assert check(parse(example), "h100") == []


def test_the_facts_have_one_home():
    from flashgen.translators.backends import get_backend

    flow = ROLE_DATAFLOW["sm_90"]
    assert get_backend("sm90").max_stages == flow.max_stages
    assert all(get_backend("sm90").accepts(None, dt) for dt in flow.dtypes)
    assert not get_backend("sm90").accepts(None, "fp32")
    assert f"Role producer warps {flow.producer_warps}" in library.render(Variant(), dtype="bf16", arch="sm_90")


CTX = dict(head_dim=64, variant_name="causal", variant_lines=["causal"], semantics="...", tl_reference="REF")
STAGE_CTX = {"sketch": {}, "params": dict(sketch="SK", hardware=[("smem", 1)])}  # as flashgen.agent.loop gives them


@pytest.mark.parametrize("stage", ["sketch", "params"])
def test_the_prompts_teach_the_hopper_form_only_on_sm90(stage):
    for gpu, dtype, taught in (("h100", "bf16", True), ("h200", "fp16", True), ("h200", "fp32", False),
                               ("a100", "bf16", False), ("t4", "fp16", False)):
        text = prompts.render(stage, target=get_target(gpu), dtype=dtype, **CTX, **STAGE_CTX[stage])
        assert ("the Hopper dataflow" in text) == taught, (gpu, dtype)
        assert ("stages STAGES" in text) == (taught and stage == "params")
        assert "\n\n\n" not in text


def test_tl_library_shows_a_program_for_an_arch(monkeypatch, capsys):
    import sys

    from flashgen import cli

    monkeypatch.setattr(sys, "argv", ["flashgen", "tl", "library", "--show", "gqa", "--arch", "sm_90", "--dtype", "bf16"])
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    want = library.render(library.PROGRAMS["gqa"], dtype="bf16", arch="sm_90", name="gqa")
    assert capsys.readouterr().out == want and "Role consumer warps WARPS" in want
    assert "BLOCK_M = 128" in want  # the Hopper defaults: two consumer warpgroups
