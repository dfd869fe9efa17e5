"""The sm90 path takes its dataflow from the TL: a Hopper-form program lowers to it with its stages and warps; a plain
program on sm_90 goes to the sm80 path with a note; what the sm90 kernel cannot implement is refused in one line."""

import re

import pytest

from flashgen.targets import get_target
from flashgen.tl_spec import check, format_program, parse
from flashgen.translators import UnsupportedConstruct, lower, translate
from flashgen.translators.params import choose_params
from flashgen.variant import DType
from tests.hopper_programs import drop, hopper, line_of, plain, replace_line

H200 = get_target("h200")


def _no_tl_lines(source: str) -> str:
    # a score modification's comment names its TL line, which moves between the two forms
    return re.sub(r"TL line \d+", "TL line N", source)


@pytest.mark.parametrize("name, dtype, head_dim", [("causal", "bf16", 64), ("plain", "fp16", 128),
                                                   ("window", "bf16", 128), ("alibi", "fp16", 64),
                                                   ("relu", "bf16", 64)])
def test_the_hopper_form_gives_the_sm90_kernel_of_the_same_parameters(name, dtype, head_dim):
    from flashgen.tl_spec.library import PROGRAMS

    params = choose_params(PROGRAMS[name], H200, DType(dtype), head_dim)
    hop = translate(parse(hopper(name, dtype, params, head_dim), "kernel.tl"), H200)
    old = translate(parse(plain(name, dtype, params, head_dim), "kernel.tl"), H200, backend="sm90")
    assert hop.plan.backend == "sm90" and hop.notes == old.notes == []
    assert _no_tl_lines(hop.source) == _no_tl_lines(old.source) and hop.manifest == old.manifest
    assert (hop.plan.stages, hop.plan.warps) == (params["STAGES"], params["BLOCK_M"] // 16)


def test_a_plain_program_on_sm90_goes_to_the_sm80_path_with_a_note():
    plan, notes = lower(parse(plain("causal", "fp16", {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2})), H200)
    assert plan.backend == "sm80" and plan.target.name == "h200"
    assert notes == ["the program has no Role blocks (the Hopper dataflow, docs/llm-tl.md): the sm80 path translates "
                     "it on sm_90; the sm90 path takes programs written with a producer and a consumer role"]


def test_the_rings_decide_the_stages_and_the_consumer_the_warps():
    text = hopper().replace("stages STAGES", "stages 3")
    plan, notes = lower(parse(text), H200)
    assert plan.stages == 3 and notes == ["Params STAGES = 2 but the K/V rings have 3: the kernel uses 3"]


def refused(text: str, target=H200, **kwargs) -> str:
    with pytest.raises(UnsupportedConstruct) as info:
        lower(parse(text), target, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_consumer_warps_must_be_one_per_16_query_rows():
    text = hopper(params={"BLOCK_M": 192, "BLOCK_N": 64, "WARPS": 8, "STAGES": 2})
    assert refused(text) == (f"line {line_of(text, 'Role consumer warps WARPS')}: Role consumer warps 8: the sm90 "
                             "kernel runs one consumer warp per 16 query rows (a warpgroup per 64), so BLOCK_M = 192 "
                             "needs Role consumer warps 12")


def test_the_producer_is_one_warpgroup():
    text = hopper().replace("Role producer warps 4", "Role producer warps 8")
    assert refused(text).startswith(f"line {line_of(text, 'Role producer warps 8')}: Role producer warps 8: the sm90 "
                                    "kernel has one producer warpgroup")


def test_q_from_registers_is_refused():
    text = replace_line(hopper(), "Wait Q_s", "Copy Q_s from shared to register Q_r")
    text = replace_line(text, "Compute O_r = 0", "Compute O_r = 0\nWait Q_s\nAllocate Q_r in register shape "
                                                 "[BLOCK_M, D] dtype bf16")
    text = format_program(parse(text.replace("Compute GEMM Q_s, K_s^T", "Compute GEMM Q_r, K_s^T")))
    assert check(parse(text)) == []
    message = refused(text)
    assert message.startswith(f"line {line_of(text, 'Compute GEMM Q_r, K_s^T and get S_r')}: Compute GEMM Q_r, ...: "
                              "the sm90 kernel reads Q from shared memory")


def test_k_and_v_share_one_ring():
    text = hopper().replace("Allocate V_s in shared shape [BLOCK_N, D] dtype bf16 stages STAGES",
                            "Allocate V_s in shared shape [BLOCK_N, D] dtype bf16 stages 3")
    assert "K_s has 2 stages and V_s 3: the sm90 kernel keeps K and V in one ring" in refused(text)


def test_roles_where_no_warp_specialized_path_takes_them_are_refused():
    fp32 = hopper(dtype="fp32")
    assert "(sm90), which does not take fp32: write the program without roles" in refused(fp32)
    message = refused(hopper(), get_target("a100"))
    assert "and a100 (sm_80) has none" in message and message.startswith("line ")


def test_a_path_pinned_by_the_caller_gets_the_roles_flattened():
    params = {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2}
    hop = translate(parse(hopper(params=params)), H200, backend="sm80")
    old = translate(parse(plain(params=params)), H200, backend="sm80")
    assert hop.plan.backend == "sm80" and hop.source == old.source
    assert hop.notes == ["the Role blocks (Hopper dataflow) are flattened for the sm80 path: its own loads and barriers "
                         "replace the roles' handshakes (the same computation)"]


def test_a_broken_handshake_is_refused_by_the_translator_too():
    text = drop(hopper(), "Release V_s stage n_blk")
    assert "the consumer never releases V_s" in refused(text)


def test_search_builds_each_pinned_path_from_its_own_dataflow():
    from flashgen.translators.search import translate_with_params
    from flashgen.variant import Variant

    params = {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 8, "STAGES": 2, "Q_IN_REGS": 1}
    own = translate_with_params(Variant(causal=True), H200, DType.bf16, 64, params)
    sm80 = translate_with_params(Variant(causal=True), H200, DType.bf16, 64, {**params, "WARPS": 4}, backend="sm80")
    assert own.plan.backend == "sm90" and own.notes == []
    assert sm80.plan.backend == "sm80" and sm80.notes == []


def test_the_roles_may_name_their_loop_variables_differently():
    lines = hopper().splitlines(keepends=True)
    at = [i for i, t in enumerate(lines) if t.strip() == "for n_blk in range(n_end)"][1]  # the consumer's key loop
    renamed = "".join(lines[:at] + [t.replace("n_blk", "j") for t in lines[at:]])
    assert check(parse(renamed)) == []
    assert translate(parse(renamed), H200).source == translate(parse(hopper()), H200).source
