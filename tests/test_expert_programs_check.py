"""The expert's full TL, with the parameters it picks, passes the checker on every target where the
translator builds it: budgets must count what the kernel really holds (fp32 operand fragments are not
accumulators; bf16/fp32 shared tiles are fp16 on Turing)."""

import pytest

from flashgen.agent.environment import Environment
from flashgen.tl_spec import check, parse
from flashgen.variant import DType, Variant


@pytest.mark.parametrize("gpu", ["t4", "rtx8000", "a100", "h200"])
@pytest.mark.parametrize("dtype", [DType.bf16, DType.fp32], ids=lambda d: d.value)
@pytest.mark.parametrize("variant", [Variant(causal=True), Variant(split_kv=True, return_lse=True)], ids=lambda v: v.name)
def test_expert_program_checks_clean_at_head_dim_256(gpu, dtype, variant):
    env = Environment()
    target = env.target(gpu)
    params = env.choose_params(variant, target, dtype, 256)[0]
    program = parse(env.library_tl(variant, target, dtype, 256, form="full", params=params))
    errors = [str(d) for d in check(program, target) if d.severity == "error"]
    assert not errors, errors
