"""The translator's backends (flashgen/translators/backends): each folder is listed once, each target gets one
backend, the plan carries it, and each backend's facts agree with the targets it serves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flashgen.errors import UsageError
from flashgen.harness.compile import ARCH_FLAGS, include_dirs
from flashgen.targets import TARGETS, gencode_flags, get_target, resolve_target
from flashgen.tl_spec import library, parse
from flashgen.translators import lower, plan_for_variant
from flashgen.translators.backends import BACKENDS, backend_for, get_backend
from flashgen.translators.backends.base import BACKENDS_DIR, SHARED_TEMPLATES, SKELETON
from flashgen.translators.plan import NATIVE_HEAD_DIMS
from flashgen.translators.render import render
from flashgen.variant import DType, Variant

TRANSLATORS = Path(__file__).resolve().parents[1] / "flashgen" / "translators"


def test_every_backend_folder_is_listed_once_under_its_name():
    folders = sorted(p.name for p in BACKENDS_DIR.iterdir() if (p / "__init__.py").is_file())
    assert sorted(b.name for b in BACKENDS) == folders, "a backend folder needs its line in BACKENDS"
    for backend in BACKENDS:
        assert backend.folder == BACKENDS_DIR / backend.name and get_backend(backend.name) is backend
        assert (backend.include_dir / "flashgen" / backend.arch_header).is_file()
        assert backend.include_dir in include_dirs()  # nvcc finds "flashgen/<header>" too
    with pytest.raises(UsageError, match="unknown translator backend"):
        get_backend("sm10")


def test_each_target_has_one_backend_and_the_plan_carries_it():
    assert {name: backend_for(t).name for name, t in TARGETS.items()} == {
        "t4": "sm75", "rtx8000": "sm75", "a100": "sm80", "a10": "sm80", "rtx3090": "sm80", "l4": "sm80",
        "rtx4090": "sm80", "h100": "sm90", "h200": "sm90"}
    # what the Hopper path does not take stays on the sm80 path
    h200 = get_target("h200")
    assert backend_for(h200, Variant(), DType.fp32).name == "sm80"
    assert backend_for(h200, Variant(split_kv=True, return_lse=True), DType.bf16).name == "sm80"
    plan = plan_for_variant(Variant(causal=True), "t4", DType.bf16, 64)
    assert (plan.backend, plan.target.name, plan.arch) == ("sm75", "t4", "sm_75")
    tl = library.render(Variant(), dtype=DType.fp16, arch="sm_90", head_dim=64, form="full")
    lowered, _notes = lower(parse(tl, "kernel.tl"), get_target("h200"))
    assert (lowered.backend, lowered.target.name) == ("sm90", "h200")
    tl32 = library.render(Variant(), dtype=DType.fp32, arch="sm_90", head_dim=64, form="full")
    lowered, notes = lower(parse(tl32, "kernel.tl"), get_target("h200"))
    assert lowered.backend == "sm80" and any("sm80 path" in n for n in notes)
    # an arch string stands for the first known GPU of it
    assert plan_for_variant(Variant(), "sm_86", DType.fp16, 64).target.name == "a10"


@pytest.mark.parametrize("name", list(TARGETS))
def test_backend_facts_agree_with_the_target(name):
    target = TARGETS[name]
    backend = backend_for(target)
    assert backend.nvcc_flags(target) == ARCH_FLAGS[backend.compile_arch(target)]
    assert backend.smem_limit(target) == target.smem_per_block_bytes
    instructions = {m.instruction for m in target.mma}
    for dtype in DType:
        if backend.accepts(None, dtype):
            assert backend.mma_instructions[dtype.value].split()[0] in instructions, (name, dtype)
    for (dtype, head_dim), params in backend.defaults.items():
        assert head_dim in backend.head_dims and params["STAGES"] <= backend.max_stages
        plan = plan_for_variant(Variant(), target, DType(dtype), head_dim, params=params)
        if head_dim not in NATIVE_HEAD_DIMS and backend.smem_bytes(plan) > target.smem_per_block_bytes:
            # an in-between dim's own entry (fp32 d200..d248: 8 warps) may not fit a smaller GPU: the choice
            # passes it over for the native entry, which does
            plan = plan_for_variant(Variant(), target, DType(dtype), head_dim)
            assert plan.block_m != params["BLOCK_M"], (name, dtype, head_dim)
        assert backend.smem_bytes(plan) <= target.smem_per_block_bytes, (name, dtype, head_dim)
    assert max(backend.search_space.stages) >= backend.max_stages


def test_templates_extend_the_shared_skeleton():
    for backend in BACKENDS:
        if backend.own_renderer:  # the Hopper path's kernel shares no structure with the mma.sync skeleton
            continue
        for template in backend.folder.glob("*.cu.j2"):
            assert template.read_text().startswith(f'{{% extends "{SKELETON}" %}}'), template
    skeleton = (SHARED_TEMPLATES / SKELETON).read_text()
    assert "turing" not in skeleton and "stages == 2" not in skeleton  # path choices live in the backends
    bf16_t4 = render(plan_for_variant(Variant(), "t4", DType.bf16, 64))[0]
    fp16_t4 = render(plan_for_variant(Variant(), "t4", DType.fp16, 64))[0]
    assert "scaled_tile_loader<BLOCK_N" in bf16_t4 and "scaled_tile_loader<BLOCK_N" not in fp16_t4


def test_targets_and_nvcc_flags_from_one_place():
    assert resolve_target("sm_75").name == "t4" and resolve_target("h100-sxm").name == "h100"
    assert resolve_target("sm_90a").name == "h100" and resolve_target(TARGETS["l4"]) is TARGETS["l4"]
    with pytest.raises(UsageError, match="no known GPU has arch"):
        resolve_target("sm_70")
    assert gencode_flags("sm_90a") == ("-gencode=arch=compute_90a,code=sm_90a",)
    assert {a: gencode_flags(a) for a in ARCH_FLAGS} == ARCH_FLAGS


def _translator_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flashgen.translators"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("flashgen.translators")}
    return found


def test_plan_is_the_bottom_of_the_translators_and_backends_import_no_renderer():
    assert _translator_imports(TRANSLATORS / "plan.py") == set()
    for path in (TRANSLATORS / "backends").rglob("*.py"):
        imports = _translator_imports(path)
        assert all(m == "flashgen.translators.plan" or m.startswith("flashgen.translators.backends")
                   for m in imports), (path, imports)


@pytest.mark.parametrize("dtype, backend", [(DType.bf16, "sm90"), (DType.fp32, "sm80")])
def test_the_code_path_is_recorded_with_why(dtype, backend):
    """meta.json's code_path: the path a kernel's TL takes and why (on sm_90, fp32 goes to the sm80 path, and the
    record says so)."""
    from flashgen.harness.environment import Environment
    from flashgen.tl_spec import library

    target = get_target("h200")
    tl = library.render(Variant(causal=True), dtype=dtype, arch=target.arch, head_dim=128, form="full")
    path = Environment().code_path(tl, target)
    assert path["backend"] == backend
    assert path["why"][0] == get_backend(backend).choice_note(target)
    if backend == "sm80":
        assert any("fp32" in note and "sm80" in note for note in path["why"][1:]), path
    assert Environment().code_path("not a TL program", target) is None
