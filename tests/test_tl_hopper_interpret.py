"""`tl run` of the Hopper dataflow: the roles run as coroutines; correct programs match fp64 exactly as the plain
form does, and each kind of broken handshake (the checker bypassed) gives a wrong result or a one-line deadlock."""

import json
import sys

import numpy as np
import pytest

from flashgen.tl_spec import TLBudgetError, TLRuntimeError, compare, interpret, parse
from flashgen.variant import Shape
from tests.hopper_programs import FAMILIES, SHAPE, drop, hopper, line_of, move_after, plain

SHAPES = {"gqa": [Shape(B=2, H=4, KVH=2, N=130, M=333, D=64), Shape(B=1, H=4, KVH=2, N=100, M=40, D=64)],
          "mqa": [Shape(B=2, H=4, KVH=1, N=70, M=200, D=64)]}
MHA = [Shape(B=2, H=2, N=130, M=333, D=64), Shape(B=1, H=2, N=200, M=71, D=64)]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_matches_fp64_and_the_plain_form_exactly(name):
    hop, flat = parse(hopper(name)), parse(plain(name))
    for shape in SHAPES.get(name, MHA):
        result = compare(hop, shape, seed=7)
        assert result.rel_err < 1e-9, (name, shape, result.rel_err)
        a, b = interpret(hop, shape, seed=7), interpret(flat, shape, seed=7)
        assert a.outputs.keys() == b.outputs.keys()
        for key in a.outputs:  # the same operations in the same order: the same values, bit for bit
            assert np.array_equal(a.outputs[key], b.outputs[key], equal_nan=True), (name, key)
        assert a.counts.mma_flops == b.counts.mma_flops and a.counts.bytes["global_read"] == b.counts.bytes["global_read"]


def test_three_stages_and_one_stage_match_too():
    for stages in (1, 3):
        text = hopper("window", params={"BLOCK_M": 128, "BLOCK_N": 32, "WARPS": 8, "STAGES": stages})
        assert compare(parse(text), Shape(B=1, H=2, N=257, M=300, D=64), seed=1).rel_err < 1e-9


def test_the_shared_reads_of_q_count_every_key_tile():
    """S = Q_s K_s^T reads Q from shared memory for every key tile (the plain form reads it once into registers)."""
    a, b = interpret(parse(hopper("plain")), SHAPE, 0), interpret(parse(plain("plain")), SHAPE, 0)
    key_tiles, q_tiles = -(-SHAPE.M // 64), -(-SHAPE.N // 128)
    q_tile = 128 * 64 * 2
    extra = SHAPE.B * SHAPE.H * q_tiles * q_tile * (key_tiles - 1)
    assert a.counts.bytes["shared_read"] - b.counts.bytes["shared_read"] == extra


def bypassed(text: str) -> float:
    """The error against fp64 of a program run without the checker (inf where NaN or -inf rows went wrong)."""
    return compare(parse(text), SHAPE, seed=3).rel_err


def test_a_dropped_wait_reads_a_stage_that_has_not_landed():
    assert bypassed(drop(hopper(), "Wait K_s stage n_blk")) > 1e-3
    assert bypassed(drop(hopper(), "Wait V_s stage n_blk")) > 1e-3
    assert bypassed(drop(hopper(), "Wait Q_s")) > 1e-3


def test_a_dropped_release_deadlocks_with_one_line():
    text = drop(hopper(), "Release V_s stage n_blk")
    with pytest.raises(TLRuntimeError) as info:
        bypassed(text)
    message = str(info.value)
    assert "\n" not in message
    acquire, wait = line_of(text, "Acquire V_s stage n_blk"), line_of(text, "Wait V_s stage n_blk")
    assert message == (f"<tl>:{acquire}:13: deadlock: the producer waits at line {acquire} to acquire V_s stage 2 "
                       f"(slot 0), which is not released; the consumer waits at line {wait} for V_s stage 2 (slot 0), "
                       "whose copy is not issued")


def test_a_dropped_acquire_lets_the_producer_overwrite_a_stage():
    assert bypassed(drop(hopper(), "Acquire K_s stage n_blk")) > 1e-3
    assert bypassed(drop(hopper(), "Acquire V_s stage n_blk")) > 1e-3


def test_a_read_after_the_release_sees_a_stage_the_producer_may_refill():
    assert bypassed(move_after(hopper(), "Release K_s stage n_blk", "Wait K_s stage n_blk")) > 1e-3
    assert bypassed(move_after(hopper(), "Release V_s stage n_blk", "Wait V_s stage n_blk")) > 1e-3


def test_roles_walking_different_stages_deadlock_or_go_wrong():
    shifted = hopper().replace("Wait V_s stage n_blk", "Wait V_s stage n_blk + 1").replace(
        "Release V_s stage n_blk", "Release V_s stage n_blk + 1")
    with pytest.raises(TLRuntimeError, match="deadlock: the producer waits at line .* to acquire V_s stage"):
        bypassed(shifted)
    lines = hopper().splitlines(keepends=True)
    at = line_of(hopper(), "for n_blk in range(n_end)", 1) - 1
    lines[at] = lines[at].replace("range(n_end)", "range(1, n_end)")
    assert bypassed("".join(lines)) > 1e-3  # each Wait takes the slot's next copy: tile 0 read as tile 2, ...
    fewer = hopper("plain").replace("Acquire V_s stage n_blk", "Acquire V_s stage n_blk + 1")
    assert bypassed(fewer.replace("V_s stage n_blk async", "V_s stage n_blk + 1 async")) > 1e-3


def test_the_operation_budget_stops_a_runaway_role_loop():
    text = hopper("plain").replace("for n_blk in range(cdiv(M, BLOCK_N))", "for n_blk in range(1000000000)")
    assert text.count("range(1000000000)") == 2
    with pytest.raises(TLBudgetError, match="used up in loop 'for n_blk'"):
        interpret(parse(text), Shape(B=1, H=1, N=64, M=64, D=64))


def test_tl_run_on_a_hopper_file(tmp_path, monkeypatch, capsys):
    from flashgen import cli

    path = tmp_path / "k.tl"
    path.write_text(hopper("window"))
    monkeypatch.setattr(sys, "argv", ["flashgen", "tl", "run", str(path), "--shape", "B=2,H=2,N=200,M=333,D=64",
                                      "--json"])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["passed"]
