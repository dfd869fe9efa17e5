"""Issue 12, Messages and Conventions: user text prints as typed (no rich markup), every bad flag value is one
line naming the flag and its allowed range before any work, `flashgen --version`, `python -m flashgen`."""

import os
import subprocess
import sys

import pytest

LIBRARY = os.path.join(os.path.dirname(__file__), "..", "flashgen", "tl_spec", "library")


def run(*args, tmp_path, env_extra=None, prelude=""):
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home"), **(env_extra or {})}
    code = f"import sys; {prelude}sys.argv = ['flashgen', *sys.argv[1:]]; from flashgen.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)


def one_error_line(done) -> str:
    assert done.returncode not in (0, 1, 3), (done.returncode, done.stdout, done.stderr)
    both = done.stdout + done.stderr
    assert "Traceback" not in both and "internal error" not in both, both
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("gpu", ["[/x]", "[b]h100", "[bold red]x[/]"])
def test_gpu_name_prints_as_typed(gpu, tmp_path):
    line = one_error_line(run("generate", "--gpu", gpu, tmp_path=tmp_path))
    assert line.startswith(f"error: unknown GPU {gpu!r}; known:"), line


def test_tl_file_name_prints_as_typed(tmp_path):
    (tmp_path / "[").mkdir()
    path = tmp_path / "[" / "[bold]x.tl"
    path.write_text("hi\n")
    bad = tmp_path / "[" / "[/bold]y.tl"
    done = run("tl", "check", str(path), str(bad), tmp_path=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}:1:1: unknown statement 'hi'" in done.stderr
    assert f"error: {bad}: no such file" in done.stderr


def test_install_hint_keeps_its_brackets(tmp_path):
    done = run("generate", "--provider", "anthropic", "--out", str(tmp_path / "o"), tmp_path=tmp_path,
               env_extra={"ANTHROPIC_API_KEY": "x"}, prelude="sys.modules['anthropic'] = None; ")
    assert one_error_line(done) == "error: the 'anthropic' package is not installed: pip install 'flashgen[llm]'"


def test_runs_show_keeps_status_brackets(tmp_path):
    from typer.testing import CliRunner

    from flashgen.cli import app
    from flashgen.harness.store import Store

    store = Store(tmp_path / "home")
    run_id = store.new_run("[b]kind", {"note": "[/x] [red]"})
    store.finish_run(run_id, "done", {"s": "[/]"})
    env = {"FLASHGEN_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    shown = CliRunner().invoke(app, ["runs", "show", str(run_id)], env=env)
    assert shown.exit_code == 0, shown.output
    assert f"run {run_id} [b]kind [done] created" in shown.output
    assert 'meta: {"note": "[/x] [red]"}' in shown.output and 'summary: {"s": "[/]"}' in shown.output
    listed = CliRunner().invoke(app, ["runs", "list"], env=env)
    assert listed.exit_code == 0 and "[b]kind" in listed.output and '"[/x] [red]"' in listed.output, listed.output
    assert "\\[" not in listed.output + shown.output


@pytest.mark.parametrize("args, message", [
    (["--goal", "-1"], "--goal -1: must be greater than 0"),
    (["--goal", "nan"], "--goal nan: must be greater than 0"),
    (["--max-cost", "-1"], "--max-cost -1: must be greater than 0"),
    (["--max-wall", "0"], "--max-wall 0: must be greater than 0"),
    (["--max-iters", "0"], "--max-iters 0: must be greater than or equal to 1"),
    (["--max-tokens", "0"], "--max-tokens 0: must be greater than or equal to 1"),
    (["--head-dim", "0"], "--head-dim 0: head dims are multiples of 8 from 8 to 256 (rows move in 16-byte chunks, "
                          "8 elements of 16 bits; pad the tensors' last axis to the next multiple yourself)"),
    (["--kv-group", "0"], "--kv-group 0: must be greater than or equal to 1"),
    (["--kv-heads", "0", "--heads", "8"], "--kv-heads 0: must be at least 1"),
    (["--softcap", "inf"], "--softcap inf: must be a finite number greater than 0"),
    (["--softcap", "nan"], "--softcap nan: must be a finite number greater than 0"),
    (["--softcap", "-3"], "--softcap -3: must be a finite number greater than 0"),
    (["--softcap", "0"], "--softcap 0: must be a finite number greater than 0"),
    (["--causal", "--window", "0"], "--window 0: must be greater than or equal to 1"),
])
def test_bad_generate_flag_is_one_line_naming_it(args, message, tmp_path):
    out = tmp_path / "out"
    line = one_error_line(run("generate", *args, "--out", str(out), tmp_path=tmp_path))
    assert line == f"error: {message}"
    assert not out.exists() and not (tmp_path / "home").exists()  # refused before any work


def test_out_that_is_a_file_or_unwritable_is_refused_first(tmp_path):
    existing = tmp_path / "afile"
    existing.write_text("x")
    line = one_error_line(run("generate", "--out", str(existing), tmp_path=tmp_path))
    assert line == f"error: --out {existing}: is an existing file, expected a folder (new or existing)"
    line = one_error_line(run("generate", "--out", str(existing / "sub"), tmp_path=tmp_path))
    assert line == f"error: --out {existing / 'sub'}: {existing} is a file, so the folder cannot be created"
    # a folder that cannot be written (/proc refuses new folders even to root)
    line = one_error_line(run("generate", "--out", "/proc/flashgen-out/k", tmp_path=tmp_path))
    assert line.startswith("error: --out /proc/flashgen-out/k: folder not writable (/proc: "), line
    assert not (tmp_path / "home").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only folders")
def test_out_in_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        line = one_error_line(run("generate", "--out", str(ro / "k"), tmp_path=tmp_path))
    finally:
        ro.chmod(0o755)
    assert line.startswith(f"error: --out {ro / 'k'}: folder not writable"), line


def test_api_refuses_bad_budget_in_one_line(tmp_path):
    import flashgen
    from flashgen.errors import UsageError

    with pytest.raises(UsageError, match=r"^max_cost_usd=-1\.0: must be greater than 0$"):
        flashgen.generate(gpu="a100", max_cost_usd=-1.0, store=None)
    with pytest.raises(UsageError, match=r"^softcap inf: must be a finite number greater than 0$"):
        flashgen.generate(gpu="a100", softcap=float("inf"))


@pytest.mark.parametrize("shape, message", [
    ("B=1,H=1,N=1000000000000,M=4,D=64", "--shape 'B=1,H=1,N=1000000000000,M=4,D=64': B*H*N*D = 64000000000000 "
     "values; a CPU run allows at most 134217728 per array (1 GiB of fp64), use smaller sizes"),
    ("B=1,H=1,N=100000,M=100000,D=64", "--shape 'B=1,H=1,N=100000,M=100000,D=64': N*M = 10000000000 values; "
     "a CPU run allows at most 134217728 per array (1 GiB of fp64), use smaller sizes"),
    ("B=2,H=x", "--shape 'B=2,H=x': bad shape item 'H=x': expected NAME=INTEGER, e.g. B=2,H=4,N=200,M=333,D=64"),
    ("B=2,H=4,N=0,M=3,D=64", "--shape 'B=2,H=4,N=0,M=3,D=64': N: Input should be greater than or equal to 1"),
])
def test_bad_shape_is_one_line(shape, message, tmp_path):
    line = one_error_line(run("tl", "run", os.path.join(LIBRARY, "causal.full.tl"), "--shape", shape,
                              tmp_path=tmp_path))
    assert line == f"error: {message}"


@pytest.mark.parametrize("args, message", [
    (["tl", "run", "X.tl", "--tol", "nan"], "--tol nan: must be a finite number >= 0"),
    (["tl", "run", "X.tl", "--tol", "-1"], "--tol -1: must be a finite number >= 0"),
    (["verify", "nope", "--timeout", "0"], "--timeout 0: must be a number of seconds greater than 0"),
    (["bench", "nope", "--min-time", "-1"], "--min-time -1: must be a number of seconds greater than 0"),
    (["bench", "nope", "--rounds", "0"], "--rounds must be at least 1"),
    (["bench", "nope", "--settle", "-1"], "--settle -1: must be a number of seconds, 0 or more"),
    (["bench", "nope", "--settle", "nan"], "--settle nan: must be a number of seconds, 0 or more"),
    (["runs", "list", "--limit", "0"], "--limit 0: must be at least 1"),
    (["tune", "--gpu", "a100", "--dtype", "fp16", "--head-dim", "128", "--budget", "0"], "--budget 0: must be a number of seconds greater than 0"),
])
def test_other_bad_flags_are_one_line(args, message, tmp_path):
    line = one_error_line(run(*args, tmp_path=tmp_path))
    assert line == f"error: {message}"


def test_version_and_python_m(tmp_path):
    import flashgen

    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    for cmd in ([sys.executable, "-m", "flashgen", "--version"], [sys.executable, "-m", "flashgen.cli", "--version"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert done.returncode == 0 and done.stdout == f"flashgen {flashgen.__version__}\n", done
    done = subprocess.run([sys.executable, "-m", "flashgen", "tl", "library"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "causal" in done.stdout, done.stderr


@pytest.mark.parametrize("group", [[], ["tl"], ["library"], ["runs"]])
def test_command_lists_wrap_each_help_as_one_paragraph(group):
    """The command panels of `flashgen --help` (and of each group) fill their lines: a description continues on the
    next line only where its next word would not fit (typer's "rich" help mode kept the docstrings' own line breaks,
    so at 80 columns `targets` and `bench` broke mid-sentence); every typer app shares console.APP_SETTINGS."""
    from typer.testing import CliRunner

    from flashgen.cli import app

    width = 80
    output = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": str(width)}).output
    panel = output[output.index("─ Commands ─"):].splitlines()[1:]
    rows = [line[2:-2] for line in panel if line.startswith("│ ")]  # "│ name  text │"
    assert rows, output
    name = rows[0].split()[0]
    text_col = len(rows[0]) - len(rows[0][len(name):].lstrip())  # where the descriptions start
    for prev, line in zip(rows, rows[1:]):
        if line[:text_col].strip():  # a new command
            continue
        first_word = line[text_col:].split()[0]
        room = len(prev) - len(prev.rstrip())
        assert len(first_word) + 1 > room, f"broke early before {first_word!r}:\n{prev}\n{line}"


def _commands():
    from typer.main import get_command

    from flashgen.cli import app

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(get_command(app), []))


@pytest.mark.parametrize("path", [" ".join(p) or "flashgen" for p, _ in _commands()])
def test_help_prints_every_word_of_its_text(path):
    """Each command's --help shows every word of its own help and of its options' (help is read as Markdown, which
    would drop an unescaped <date> as HTML; typer's "rich" mode dropped NAME[i]'s [i] as a style tag). Code spans
    print without their backticks."""
    from typer.testing import CliRunner

    from flashgen.cli import app

    args = [] if path == "flashgen" else path.split()
    command = dict((" ".join(p) or "flashgen", c) for p, c in _commands())[path]
    output = " ".join(CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"}).output.split())
    texts = [command.help or ""] + [getattr(param, "help", None) or "" for param in command.params]
    texts = [t.partition("\n\n")[0] if t is command.help else t for t in texts]  # the page shows its first paragraph
    missing = {word for text in texts for word in text.replace("`", "").split() if word not in output}
    assert not missing, f"{path} --help lost {sorted(missing)}"


@pytest.mark.parametrize("given, expected", [((), ("BENCH_SETTLE_S", "BENCH_SETTLE_EACH")),
                                             (("--settle", "0"), (0.0, "BENCH_SETTLE_EACH")),
                                             (("--settle", "1.5", "--settle-each"), (1.5, True)),
                                             (("--no-settle-each",), ("BENCH_SETTLE_S", False))])
def test_settling_defaults_to_the_benchmarks_constants(given, expected, tmp_path):
    """Without --settle a suite settles the card for bench.BENCH_SETTLE_S (the twin A/B that chose it is in its
    comment), and without --settle-each / --no-settle-each it warms each timed block as bench.BENCH_SETTLE_EACH
    says; --settle 0 turns settling off."""
    from flashgen.harness import bench

    stub = ("import flashgen.harness.cli as c; "
            "c._suite = lambda *a, settle_each, **k: print('settle_s', float(a[-1]), 'settle_each', settle_each); ")
    done = run("bench", "--suite", "hopper", *given, tmp_path=tmp_path, prelude=stub)
    assert done.returncode == 0, done.stderr
    settle_s, settle_each = (getattr(bench, v) if isinstance(v, str) else v for v in expected)
    assert done.stdout.strip() == f"settle_s {float(settle_s)} settle_each {settle_each}", done.stdout
