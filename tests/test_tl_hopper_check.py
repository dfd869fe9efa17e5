"""The checker's Hopper-dataflow rules: each mutant of a correct program gets one clear diagnostic at its line."""

import pytest

from flashgen.targets import ROLE_DATAFLOW, get_target
from flashgen.tl_spec import check, library, parse
from flashgen.tl_spec.diagnostics import errors_only
from tests.hopper_programs import FAMILIES, drop, hopper, line_of, move_after, replace_line


def errors(text: str, target=None) -> list:
    return errors_only(check(parse(text, "k.tl"), target))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_library_hopper_programs_check_clean(name, gpu):
    assert check(parse(hopper(name)), gpu) == []


def test_library_writes_the_hopper_form_only_where_the_sm90_kernel_takes_it():
    from flashgen.variant import Variant

    assert "Role producer warps 4" in library.render(Variant(), dtype="fp16", arch="sm_90")
    for kwargs in ({"dtype": "fp32", "arch": "sm_90"}, {"dtype": "bf16", "arch": "sm_80"},
                   {"dtype": "bf16", "arch": "sm_75"}):
        assert "Role" not in library.render(Variant(), **kwargs)
    assert "Role" not in library.render(Variant(split_kv=True, return_lse=True), dtype="bf16", arch="sm_90")
    assert "Role" not in library.render(Variant(), dtype="bf16", arch="sm_90", roles=False)
    from flashgen.errors import UsageError

    with pytest.raises(UsageError, match="Hopper dataflow"):
        library.render(Variant(), dtype="fp16", arch="sm_80", roles=True)


def one_error(text: str, line: int, needle: str, target=None):
    found = errors(text, target)
    assert len(found) == 1, [str(d) for d in found]
    assert found[0].line == line and needle in found[0].message, str(found[0])
    assert found[0].hint
    return found[0]


def test_a_read_before_its_wait_is_rejected():
    text = drop(hopper(), "Wait K_s stage n_blk")
    one_error(text, line_of(text, "Compute GEMM Q_s, K_s^T and get S_r"),
              "reads K_s stage n_blk before its copy is awaited")


def test_a_read_of_the_q_tile_before_its_wait_is_rejected():
    text = drop(hopper(), "Wait Q_s")
    one_error(text, line_of(text, "Compute GEMM Q_s, K_s^T and get S_r"), "reads Q_s before its copy is awaited")


def test_a_wait_without_its_release_is_rejected():
    text = drop(hopper(), "Release V_s stage n_blk")
    one_error(text, line_of(text, "Wait V_s stage n_blk"),
              "Wait V_s stage n_blk has no Release V_s stage n_blk after it in this step: the producer would wait "
              "forever")


def test_a_copy_without_its_acquire_overwrites_a_stage_before_it_is_released():
    text = drop(hopper(), "Acquire K_s stage n_blk")
    one_error(text, line_of(text, "Copy K[b, h, k0 : k0 + BLOCK_N, 0 : D] from global to shared K_s stage n_blk async"),
              "overwrites K_s stage n_blk before it is released")


def test_a_read_after_the_release_is_rejected():
    text = move_after(hopper(), "Release K_s stage n_blk", "Wait K_s stage n_blk")
    d = one_error(text, line_of(text, "Compute GEMM Q_s, K_s^T and get S_r"), "reads K_s after Release K_s stage n_blk")
    assert f"(line {line_of(text, 'Release K_s stage n_blk')})" in d.message


def test_roles_walking_different_stages_are_rejected():
    # the consumer names another stage of V_s
    text = hopper().replace("Wait V_s stage n_blk", "Wait V_s stage n_blk + 1").replace(
        "Release V_s stage n_blk", "Release V_s stage n_blk + 1")
    one_error(text, line_of(text, "Wait V_s stage n_blk + 1"), "the producer and the consumer walk different stages "
                                                              "of V_s")
    # the consumer's key loop starts elsewhere
    lines = hopper().splitlines(keepends=True)
    consumer_loop = line_of(hopper(), "for n_blk in range(n_end)", 1)
    lines[consumer_loop - 1] = lines[consumer_loop - 1].replace("range(n_end)", "range(1, n_end)")
    found = errors("".join(lines))
    assert {d.line for d in found} == {line_of(hopper(), "Wait K_s stage n_blk"), line_of(hopper(), "Wait V_s stage n_blk")}
    assert all("walk different stages" in d.message and "range(1, n_end)" in d.message for d in found)


def test_roles_and_stages_need_a_target_that_has_them():
    text = hopper().replace("Target sm_90", "Target sm_80")
    d = one_error(text, line_of(text, "Allocate K_s in shared shape [BLOCK_N, D] dtype bf16 stages STAGES"),
                  "needs Target sm_90; this program is for sm_80")
    assert "plain form" in d.hint


def test_stages_beyond_the_arch_are_rejected():
    deepest = ROLE_DATAFLOW["sm_90"].max_stages
    text = hopper(params={"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 8, "STAGES": deepest + 1})
    found = errors(text)
    assert [d.line for d in found] == [line_of(text, f"Allocate {b} in shared shape [BLOCK_N, D] dtype bf16 stages "
                                                     f"STAGES") for b in ("K_s", "V_s")]
    assert f"implements at most {deepest}" in found[0].message
    assert errors(hopper(params={"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 8, "STAGES": deepest})) == []


@pytest.mark.parametrize("mutate, line, needle", [
    # copies into staged buffers outside the producer
    (lambda t: move_after(t, "Copy V[b, h, k0 : k0 + BLOCK_N, 0 : D] from global to shared V_s stage n_blk async",
                          "Wait K_s stage n_blk"),
     "Copy V[b, h, k0 : k0 + BLOCK_N, 0 : D] from global to shared V_s stage n_blk async", "an async copy outside the "
                                                                                          "producer role"),
    (lambda t: replace_line(t, "Wait V_s stage n_blk", "Copy K_s from shared to shared V_s"),
     "Copy K_s from shared to shared V_s", "copies into staged buffer 'V_s' outside the producer role"),
    (lambda t: replace_line(t, "Acquire V_s stage n_blk", "Compute O_r = 0"),
     "Compute O_r = 0", "a Compute in the producer role"),
    (lambda t: t.replace("Copy Q[b, h, q0 : q0 + BLOCK_M, 0 : D] from global to shared Q_s async",
                         "Copy Q[b, h, q0 : q0 + BLOCK_M, 0 : D] from global to shared Q_s"),
     "Copy Q[b, h, q0 : q0 + BLOCK_M, 0 : D] from global to shared Q_s", "a copy in the producer role is asynchronous"),
    (lambda t: replace_line(t, "Wait Q_s", "Acquire K_s stage 0"), "Acquire K_s stage 0", "Acquire K_s in the consumer"),
    (lambda t: replace_line(t, "Acquire V_s stage n_blk", "Wait V_s stage n_blk"),
     "Wait V_s stage n_blk", "Wait V_s in the producer"),
    (lambda t: t.replace("Role producer warps 4", "Role producer warps 8"), "Role producer warps 8",
     "the sm_90 producer is one warpgroup"),
    (lambda t: t.replace("Role consumer warps WARPS", "Role consumer warps 6"), "Role consumer warps 6",
     "a multiple of 4 warps"),
    (lambda t: t.replace("Role consumer warps WARPS", "Role producer warps 4"), "Role producer warps 4",
     "a second producer role"),
    (lambda t: move_after(t, "Allocate S_r in register shape [BLOCK_M, BLOCK_N] dtype fp32",
                          "Allocate V_s in shared shape [BLOCK_N, D] dtype bf16 stages STAGES"),
     "Allocate S_r in register shape [BLOCK_M, BLOCK_N] dtype fp32", "register tensor 'S_r' outside the roles"),
    (lambda t: t.replace("Allocate Q_s in shared shape [BLOCK_M, D] dtype bf16",
                         "Allocate Q_s in shared shape [BLOCK_M, D] dtype bf16 stages 2"),
     "Copy Q[b, h, q0 : q0 + BLOCK_M, 0 : D] from global to shared Q_s async", "'Q_s' has 2 stages: the copy names"),
])
def test_each_role_rule_names_its_line(mutate, line, needle):
    text = mutate(hopper())
    found = errors(text)
    assert found, "the mutant passed the checker"
    lines = {i for i, t in enumerate(text.splitlines(), 1) if t.strip() == line}
    assert any(d.line in lines and needle in d.message and d.hint for d in found), [str(d) for d in found]


def test_a_statement_after_the_roles_is_rejected():
    lines = hopper().splitlines(keepends=True)
    end_of_consumer = max(i for i, t in enumerate(lines) if t == "        end\n")
    lines.insert(end_of_consumer + 1, "        Let late = 1\n")
    text = "".join(lines)
    one_error(text, line_of(text, "Let late = 1"), "a statement after the Role blocks")


def test_shared_memory_counts_every_stage():
    h100 = get_target("h100")
    # d256, 128x128 tiles: Q 64 KB + 2 x (K, V) 64 KB each = 320 KB at 2 stages, over 227 KB; 1 stage fits
    big = {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 8}
    ok = hopper(params={**big, "STAGES": 1}, head_dim=256)
    assert errors(ok, h100) == []
    over = hopper(params={**big, "STAGES": 3}, head_dim=256)
    found = errors(over, h100)
    assert len(found) == 1 and "shared memory" in found[0].message and str(64 * 1024 + 6 * 32 * 1024) in \
        found[0].message


def test_gemm_rows_split_over_the_consumer_warps():
    text = hopper().replace("Role consumer warps WARPS", "Role consumer warps 12")
    found = errors(text)
    assert any("do not split into 12 warps" in d.message for d in found)
