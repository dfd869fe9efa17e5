"""The Hopper dataflow's lines (Role, stages, async copies, Acquire/Wait/Release): parse, print, `tl fmt`."""

import sys

import pytest

from flashgen.tl_spec import TLSyntaxError, ast, check, format_program, library, parse
from flashgen.variant import Variant
from tests.hopper_programs import FAMILIES, hopper


@pytest.mark.parametrize("name", FAMILIES)
def test_hopper_programs_round_trip(name):
    for form in ("full", "sketch"):
        text = library.render(library.PROGRAMS[name], dtype="bf16", arch="sm_90", form=form, name=name)
        program = parse(text)
        assert format_program(program) == text and parse(format_program(program)) == program
        assert any(isinstance(s, ast.Role) for s in program.statements())
        if form == "sketch":
            assert not program.is_full and check(program) == []


def test_the_new_lines_parse_to_their_nodes():
    text = hopper()
    program = parse(text)
    stmts = program.statements()
    roles = [s for s in stmts if isinstance(s, ast.Role)]
    assert [r.role for r in roles] == ["producer", "consumer"] and roles[0].warps == ast.Num(value=4)
    assert roles[1].warps == ast.Name(id="WARPS")
    k_s = next(s for s in stmts if isinstance(s, ast.Allocate) and s.name == "K_s")
    assert k_s.stages == ast.Name(id="STAGES") and k_s.level is ast.Level.shared
    copies = [s for s in stmts if isinstance(s, ast.Copy) and s.is_async]
    assert [c.dst.name for c in copies] == ["Q_s", "K_s", "V_s"]
    assert copies[0].stage is None and copies[1].stage == ast.Name(id="n_blk")
    kinds = [(type(s).__name__, s.buffer) for s in stmts if isinstance(s, ast.SYNC_TYPES)]
    assert kinds == [("Acquire", "K_s"), ("Acquire", "V_s"), ("Wait", "Q_s"), ("Wait", "K_s"), ("Release", "K_s"),
                     ("Wait", "V_s"), ("Release", "V_s")]
    assert ast.role_program(program) and not ast.role_program(parse(library.load("causal")))


def test_messy_spacing_formats_to_canonical_lines():
    text = """for m_blk in parallel query tiles
Role   producer   warps 2*2
Copy K from global to shared K_s stage (n_blk + 1) % 2 async
Acquire   K_s stage(n_blk)
end
Role consumer
Wait Q_s
Release K_s stage n_blk+1
end
end
"""
    assert format_program(parse(text)) == """for m_blk in parallel query tiles
  Role producer warps 2 * 2
    Copy K from global to shared K_s stage (n_blk + 1) % 2 async
    Acquire K_s stage n_blk
  end
  Role consumer
    Wait Q_s
    Release K_s stage n_blk + 1
  end
end
"""


@pytest.mark.parametrize("line, needle", [
    ("Role worker warps 4", "unknown role 'worker'"),
    ("Role producer warps", "line ends too early"),
    ("Acquire stage n_blk", "unexpected 'stage'"),
    ("Copy K[b, h, 0 : 64, 0 : D] from global to shared K_s async stage 0", "unexpected 'stage'"),
])
def test_bad_hopper_lines_are_syntax_errors_with_a_hint(line, needle):
    text = hopper().replace("Wait Q_s", line, 1)
    with pytest.raises(TLSyntaxError) as info:
        parse(text, "k.tl")
    d = info.value.diagnostics[0]
    assert needle in d.message and d.line == text.splitlines().index(next(t for t in text.splitlines()
                                                                          if t.strip() == line)) + 1
    assert d.hint


def test_an_unclosed_role_names_itself():
    lines = hopper().splitlines()
    head = lines[:lines.index("        Role consumer warps WARPS")]
    while head[-1].strip() != "end":
        head.pop()
    text = "\n".join(head[:-1])  # cut off before the producer's `end`
    with pytest.raises(TLSyntaxError) as info:
        parse(text)
    assert any(d.message == "`Role producer` opened here has no `end` (truncated file?)" for d in info.value.diagnostics)


def test_tl_fmt_writes_the_canonical_hopper_program(tmp_path, monkeypatch, capsys):
    from flashgen import cli

    canonical = library.render(Variant(causal=True, return_lse=True), dtype="fp16", arch="sm_90")
    messy = tmp_path / "k.tl"
    messy.write_text(canonical.replace("  ", "   ").replace("stage n_blk async", "stage (n_blk)   async"))
    for args in (["fmt", "--check", str(messy)], ["fmt", "--write", str(messy)]):
        monkeypatch.setattr(sys, "argv", ["flashgen", "tl", *args])
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        capsys.readouterr()
        assert code == (1 if "--check" in args else 0)
    assert messy.read_text() == canonical


def test_the_new_words_are_reserved():
    """`stage`, `stages`, `async` and `warps` are keywords now: a name cannot be one of them."""
    with pytest.raises(TLSyntaxError):
        parse(library.load("plain").replace("Let k0 = n_blk * BLOCK_N", "Let stage = n_blk * BLOCK_N"))
