"""`flashgen tl ...` commands, good and bad input: one-line errors, non-zero exits, no tracebacks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashgen.errors import MAX_INPUT_BYTES
from flashgen.tl_spec import library

LIB = Path(library.LIBRARY_DIR)


def run_cli(monkeypatch, capsys, *args):
    from flashgen import cli

    monkeypatch.setattr(sys, "argv", ["flashgen", "tl", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_library_ok(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "check", str(LIB / "plain.full.tl"), str(LIB / "causal.sketch.tl"))
    assert code == 0, err
    assert "plain.full.tl: ok (full program, 1 kernel(s))" in out and "causal.sketch.tl: ok (sketch" in out


def test_run_json_reports_errors_and_counts(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "run", str(LIB / "gqa.full.tl"), "--shape",
                             "B=2,H=4,KVH=2,N=70,M=100,D=64", "--seed", "3", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["rel_err"] < 1e-9 and record["max_abs_err"] < 1e-9 and record["passed"]
    assert record["counts"]["mma_flops"] == 2 * 4 * 2 * (2 * 64 * 128 * 64) * 2  # B*H*m-tiles*n-tiles*(2 GEMMs)


def test_run_fails_on_wrong_program(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.tl"
    bad.write_text(library.load("causal").replace("k_idx <= q_idx + M - N", "k_idx <= q_idx"))
    code, out, _ = run_cli(monkeypatch, capsys, "run", str(bad), "--shape", "B=1,H=1,N=90,M=70,D=64")
    assert code == 1 and "FAIL" in out


def test_fmt_check_and_write(tmp_path, monkeypatch, capsys):
    messy = tmp_path / "messy.tl"
    canonical = library.load("plain")
    messy.write_text(canonical.replace("  ", "    ").replace("S_r * (scale * log2e)", "(S_r) * (scale * (log2e))"))
    code, _, err = run_cli(monkeypatch, capsys, "fmt", "--check", str(messy))
    assert code == 1 and "not in canonical form" in err
    code, _, _ = run_cli(monkeypatch, capsys, "fmt", "--write", str(messy))
    assert code == 0 and messy.read_text() == canonical
    code, out, _ = run_cli(monkeypatch, capsys, "fmt", str(LIB / "causal.full.tl"))
    assert code == 0 and out == library.load("causal")


def _bad_files(tmp_path):
    files = {
        "malformed": "Target sm_80 dtype fp16 head_dim 64\nVariant softmax\nCopy Q from global into shared Q_s\n",
        "truncated": "".join(library.load("plain").splitlines(keepends=True)[:30]),
        "empty": "",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.tl"
        paths[name].write_text(text)
    paths["binary"] = tmp_path / "binary.tl"
    paths["binary"].write_bytes(b"\x7fELF\x00\x01\x02" * 50)
    paths["large"] = tmp_path / "large.tl"
    paths["large"].write_text("# x\n" * (MAX_INPUT_BYTES // 4 + 10))
    paths["missing"] = tmp_path / "nope.tl"
    return paths


@pytest.mark.parametrize("kind, needle", [("malformed", "malformed.tl:3:"), ("truncated", "no `end`"),
                                          ("empty", "empty file"), ("binary", "binary file"),
                                          ("large", "larger than"), ("missing", "no such file")])
@pytest.mark.parametrize("command", ["check", "run", "fmt"])
def test_bad_input_gives_one_line_and_nonzero_exit(tmp_path, monkeypatch, capsys, kind, needle, command):
    path = _bad_files(tmp_path)[kind]
    code, out, err = run_cli(monkeypatch, capsys, command, str(path))
    assert code != 0
    assert needle in err, err
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    # one line per problem: `check` lists each unclosed block, the others stop at the first problem
    assert len(lines) <= (5 if command == "check" else 1) and all(len(line) < 400 for line in lines), err


def test_bad_shape_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "run", str(LIB / "plain.full.tl"), "--shape", "B=2,H=x")
    assert code == 2 and "--shape" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(monkeypatch, capsys, "run", str(LIB / "plain.full.tl"), "--shape", "B=1,H=1,N=4,M=4,D=32")
    assert code == 2 and "head_dim 64" in err


def test_installed_command_on_a_binary_file(tmp_path):
    exe = Path(sys.executable).with_name("flashgen")
    if not exe.exists():
        pytest.skip("the flashgen console script is not installed next to this python")
    path = tmp_path / "bin.tl"
    path.write_bytes(bytes(range(256)))
    proc = subprocess.run([str(exe), "tl", "check", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode != 0 and "binary file" in proc.stderr and "Traceback" not in proc.stderr
