"""What flashgen writes for a user lands in the user's folders, never in the installed package: `tune --write`'s tuned
file (read over the packaged table), and `python -m flashgen.regenerate` from an installed copy (--out, or a
checkout's generated/ only)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashgen.errors import UsageError
from flashgen.harness.tune import SearchResult, record_winner
from flashgen.translators import params as params_mod
from flashgen.translators.params import TunedEntry, TunedFile, choose_params_with_source, save_tuned, tuned_key
from flashgen.variant import DType, Variant

REPO = Path(__file__).resolve().parents[1]
CAUSAL = Variant(causal=True)
PARAMS = {"BLOCK_M": 64, "BLOCK_N": 32, "WARPS": 4, "STAGES": 1, "Q_IN_REGS": 1}


def _result(params: dict[str, int]) -> SearchResult:
    from flashgen.translators.search import CandidateRecord

    record = CandidateRecord(params=params, label="64x32 w4 s1 q1", geomean_ms=0.5, times_ms={"B=1": 0.5})
    return SearchResult(target="a100", arch="sm_80", dtype="bf16", variant=CAUSAL.name,
                        variant_fields=CAUSAL.model_dump(), head_dim=128, shapes=[], candidates=[record],
                        winner=params, winner_label=record.label, winner_geomean_ms=0.5, timer="fake", budget_s=1.0,
                        created="2026-12-01T00:00:00")


def _packaged(directory: Path, params: dict[str, int]) -> None:
    entry = TunedEntry(params=params, arch="sm_80", geomean_ms=0.9, times_ms={}, candidates_timed=1,
                       date="2026-01-01", gpu="A100", timer="fake")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "a100.json").write_text(
        TunedFile(gpu="a100", entries={tuned_key(DType.bf16, CAUSAL, 128): entry}).model_dump_json())


def test_tune_write_goes_to_the_user_folder_and_wins_over_the_package(tmp_path, monkeypatch):
    packaged = tmp_path / "package-tuned"
    other = {**PARAMS, "BLOCK_N": 64}
    _packaged(packaged, other)
    before = (packaged / "a100.json").read_bytes()
    monkeypatch.setattr(params_mod, "TUNED_DIR", packaged)
    monkeypatch.delenv("FLASHGEN_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert choose_params_with_source(CAUSAL, "a100", DType.bf16, 128).params["BLOCK_N"] == 64  # the package's
    path = record_winner(_result(PARAMS))
    assert path == tmp_path / "xdg" / "flashgen" / "tuned" / "a100.json"
    assert (packaged / "a100.json").read_bytes() == before  # the package is never written
    choice = choose_params_with_source(CAUSAL, "a100", DType.bf16, 128)
    assert choice.source == "tuned" and choice.params["BLOCK_N"] == 32 and str(path) in choice.detail
    # FLASHGEN_HOME wins over the XDG folder
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    assert record_winner(_result(PARAMS)) == tmp_path / "home" / "config" / "tuned" / "a100.json"
    assert json.loads((tmp_path / "home" / "config" / "tuned" / "a100.json").read_text())["gpu"] == "a100"


def test_tuned_files_are_never_written_into_the_package():
    with pytest.raises(UsageError, match="not written into the installed package"):
        save_tuned(TunedFile(gpu="a100"), params_mod.TUNED_DIR)


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashgen.regenerate", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def test_regenerate_outside_a_checkout_needs_out(tmp_path):
    done = _run(["t4/fp16/plain_d64"], cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "not a flashgen checkout; give --out DIR" in done.stderr
    assert not (tmp_path / "generated").exists()
    (tmp_path / "generated").mkdir()  # a generated/ folder alone does not make a checkout
    assert _run(["t4/fp16/plain_d64"], cwd=tmp_path).returncode == 2
    bad = _run(["--bogus"], cwd=tmp_path)
    assert bad.returncode == 2 and "unknown option '--bogus'" in bad.stderr


def test_regenerate_works_from_an_installed_copy(tmp_path):
    """The package copied alone (what a non-editable install holds), run from a folder that is not a checkout."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "flashgen", site / "flashgen", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(site), "FLASHGEN_HOME": str(tmp_path / "home")}
    where = subprocess.run([sys.executable, "-c", "import flashgen; print(flashgen.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert where.stdout.strip().startswith(str(site))
    out = tmp_path / "kernels"
    done = _run(["--out", str(out), "t4/fp16/plain_d64"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    written = out / "t4" / "fp16" / "plain_d64"
    assert (written / "kernel.cu").read_text().startswith("// Generated") and (written / "meta.json").is_file()
    assert not (site / "generated").exists() and not (tmp_path / "generated").exists()
    again = _run(["--check", "--out", str(out), "t4/fp16/plain_d64"], cwd=tmp_path, env=env)
    assert again.returncode == 0 and "same t4/fp16/plain_d64" in again.stdout
