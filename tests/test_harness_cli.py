import json

from typer.testing import CliRunner

from flashgen.cli import app
from flashgen.harness import testkernels
from flashgen.harness.cli import load_kernel_dir
from flashgen.harness.store import Store

runner = CliRunner()


def _one_line_error(result, fragment):
    assert result.exit_code == 2, result.output
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert fragment in text


def test_unknown_kernel_dir_is_a_one_line_error(tmp_path, capsys):
    import pytest

    from flashgen.errors import FlashgenError

    with pytest.raises(FlashgenError, match="no such kernel directory"):
        load_kernel_dir(str(tmp_path / "nope"))
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "kernel.cu").write_text("x")
    with pytest.raises(FlashgenError, match="missing manifest.json"):
        load_kernel_dir(str(tmp_path / "half"))
    (tmp_path / "half" / "manifest.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(FlashgenError, match="manifest.json: arch"):
        load_kernel_dir(str(tmp_path / "half"))


def test_cli_main_prints_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "from flashgen.cli import main; main()", "bench", str(tmp_path / "nope"),
                           "--shapes", "B=1,H=1,N=8,D=64"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such kernel directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_kernel_dir_round_trip_and_bad_shapes(tmp_path):
    kdir = testkernels.write_kernel_dir(tmp_path / "k", "simple_attention", dtype="bf16", head_dim=128)
    kernel = load_kernel_dir(str(kdir))
    assert kernel.manifest.dtype.value == "bf16" and "fg_simple_attention" in kernel.source
    result = runner.invoke(app, ["bench", str(kdir), "--shapes", "B=1,Q=2"])
    assert result.exit_code != 0 and "--shapes" in str(result.exception)


def test_runs_list_and_show(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path))
    store = Store()
    run = store.new_run("attempt", {"kernel": "k1"})
    store.add_event(run, "verify", {"ok": False}, {"summary.txt": "FAIL"})
    listed = runner.invoke(app, ["runs", "list"])
    assert listed.exit_code == 0 and "attempt" in listed.output
    shown = runner.invoke(app, ["runs", "show", str(run)], terminal_width=200)
    assert shown.exit_code == 0 and "verify" in shown.output
    missing = runner.invoke(app, ["runs", "show", "999"])
    assert missing.exit_code != 0 and "no run 999" in str(missing.exception)
