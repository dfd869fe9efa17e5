"""`flashgen build FILE.tl` and flashgen.build(): a user's own TL program through the generate loop and store
(checked, interpreted on the CPU against its own fp64 meaning, translated, compiled; on a GPU verified and timed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashgen.agent.outputs import FILES
from flashgen.errors import FlashgenError
from flashgen.harness.store import Store
from flashgen.tl_spec import library, parse

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_score.tl"
SCORE = "log(1 + abs(q_idx + M - N - k_idx))"  # the example's own score term


def _has_gpu() -> bool:
    from flashgen.harness.worker import have_gpu

    return bool(have_gpu())


def flashgen(*args, home: Path, cwd: Path):
    env = {**os.environ, "FLASHGEN_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "flashgen.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


def _stderr_lines(done) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


def _variant_of(tl_text: str, edit: tuple[str, str]) -> str:
    old, new = edit
    assert old in tl_text
    return tl_text.replace(old, new, 1)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))  # the API's store, and no user's tuned file


def test_the_example_is_a_custom_score_the_checker_accepts():
    text = EXAMPLE.read_text()
    program = parse(text, str(EXAMPLE))
    assert program.is_full and program.variant.causal and SCORE in text
    from flashgen.translators.lower import computes_declared_variant

    assert not computes_declared_variant(program)  # what it computes is not a Variant: the TL is its reference


def test_cli_builds_a_users_tl_and_records_the_run(tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    done = flashgen("build", str(EXAMPLE), "--gpu", "a100", "--dtype", "fp16", "--out", str(out), home=home,
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    cuda = (out / "kernel.cu").read_text()
    assert "__global__" in cuda and SCORE in cuda  # the translator's comment on the score line it compiled
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["arch"] == "sm_80" and manifest["dtype"] == "fp16" and manifest["head_dim"] == 64
    # not a library variant: the kernel is verified against the user's program itself
    assert manifest["reference_tl"] is not None
    assert parse(manifest["reference_tl"]) == parse(EXAMPLE.read_text())
    assert parse((out / "kernel.tl").read_text()) == parse(EXAMPLE.read_text())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["generation"]["provider"] == "user" and meta["generation"]["status"] == "done"
    assert meta["roofline"]["time_s"] > 0
    # generate's summary (flashgen.agent.summary) under build's name, then what the program was verified against
    lines = done.stdout.strip().splitlines()
    assert lines[0] == f"flashgen build: done ({meta['generation']['reason']})", lines[0]
    verified = next(line for line in lines if line.startswith("verified"))
    if _has_gpu():
        assert meta["verification"]["ran"] and meta["verification"]["ok"]
        assert verified.split()[1] == "yes,"
    else:
        assert meta["verification"]["ran"] is False
        assert "no: compiled and estimated, no GPU" in verified
    assert lines[-1].startswith("program") and f"{EXAMPLE} -> {out}/: verified against its own fp64 interpretation" \
        in lines[-1]
    assert any(line.startswith("files") and f"{out}/" in line for line in lines)

    # the run is in the store, as a generate run with the user's provider and the program as its reference
    runs = Store(home).runs()
    assert len(runs) == 1 and runs[0].kind == "generate" and runs[0].status == "done"
    meta_run = runs[0].meta
    assert meta_run["provider"]["name"] == "user" and meta_run["provider"]["file"] == str(EXAMPLE)
    assert meta_run["loop"]["reference_tl"] == EXAMPLE.read_text()
    assert any(line.split()[:2] == ["run", f"{runs[0].id}:"] for line in lines)
    listed = flashgen("runs", "list", "--json", home=home, cwd=tmp_path)
    assert listed.returncode == 0 and [r["id"] for r in json.loads(listed.stdout)] == [runs[0].id]
    shown = flashgen("runs", "show", str(runs[0].id), home=home, cwd=tmp_path)
    assert shown.returncode == 0 and "provider: user" in shown.stdout


def test_api_builds_text_and_a_library_program_keeps_the_variant_reference(tmp_path):
    import flashgen

    store = Store()
    out = tmp_path / "api_out"
    kernel = flashgen.build(EXAMPLE.read_text(), gpu="a100", dtype="fp16", out=out, name="my_score.tl")
    assert kernel.manifest.reference_tl is not None and SCORE in kernel.manifest.reference_tl
    assert kernel.source == (out / "kernel.cu").read_text() and SCORE in kernel.source
    assert kernel.meta["generation"]["provider"] == "user"
    assert kernel.verified is (True if _has_gpu() else None)
    run = store.run(int(kernel.run_id))
    assert run.status == "done" and run.meta["provider"]["file"] == "my_score.tl"

    # a program that computes its Variant line (the library's causal program): the variant's own fp64 reference
    causal = flashgen.build(library.load("causal"), gpu="a100", dtype="fp16")
    assert causal.manifest.reference_tl is None and causal.manifest.variant.causal
    assert causal.out_dir is None and int(causal.run_id) == int(kernel.run_id) + 1
    assert store.run(int(causal.run_id)).meta["loop"]["reference_tl"] is None


def test_api_takes_a_path():
    import flashgen

    kernel = flashgen.build(EXAMPLE, gpu="t4", dtype="fp16")  # the sm_80 program, translated for sm_75
    assert kernel.manifest.arch == "sm_75" and kernel.manifest.reference_tl is not None
    assert Store().run(int(kernel.run_id)).meta["provider"]["file"] == str(EXAMPLE)


def test_a_checker_error_is_one_line_with_its_line_number(tmp_path):
    home = tmp_path / "home"
    bad = tmp_path / "too_big.tl"
    bad.write_text(_variant_of(EXAMPLE.read_text(), ("BLOCK_M = 64, BLOCK_N = 64", "BLOCK_M = 512, BLOCK_N = 64")))
    kernel_line = next(i for i, line in enumerate(bad.read_text().splitlines(), 1) if line.startswith("Kernel "))
    done = flashgen("build", str(bad), "--gpu", "a100", "--dtype", "fp16", "--out", str(tmp_path / "o"), home=home,
                    cwd=tmp_path)
    assert done.returncode == 1
    lines = _stderr_lines(done)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {bad}:{kernel_line}:1: ") and "registers per thread" in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "o").exists() and Store(home).runs() == []  # refused before any run


def test_a_syntax_error_is_one_line_with_its_line_number(tmp_path):
    bad = tmp_path / "syntax.tl"
    bad.write_text(_variant_of(EXAMPLE.read_text(), ("Compute S_r = S_r * (scale * log2e)",
                                                     "Compute S_r = S_r * (scale * log2e")))
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if text.strip().endswith("log2e"))
    done = flashgen("build", str(bad), "--gpu", "a100", "--dtype", "fp16", home=tmp_path / "home", cwd=tmp_path)
    lines = _stderr_lines(done)
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: {bad}:{line}:"), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, message", [
    (["nosuchfile.tl", "--gpu", "a100", "--dtype", "fp16"], "nosuchfile.tl: no such file"),
    ([str(EXAMPLE), "--gpu", "nosuchgpu", "--dtype", "fp16"], "unknown GPU 'nosuchgpu'"),
    ([str(EXAMPLE), "--gpu", "a100", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    ([str(EXAMPLE), "--gpu", "a100", "--dtype", "bf16"], "the Target line says dtype fp16, the build asks for bf16"),
    ([str(EXAMPLE), "--dtype", "fp16"], "Missing option '--gpu'"),
    ([str(EXAMPLE), "--gpu", "a100", "--dtype", "fp16", "--model", "m"], "--model needs --provider"),
    ([str(EXAMPLE), "--gpu", "a100", "--dtype", "fp16", "--provider", "expert"], "--provider expert writes"),
])
def test_bad_input_is_one_line_and_non_zero(args, message, tmp_path):
    done = flashgen("build", *args, home=tmp_path / "home", cwd=tmp_path)
    lines = _stderr_lines(done)
    assert done.returncode != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


# a program that never writes the last, partial query tile: NaN rows the CPU check finds (the checker cannot)
TAIL_BUG = ("range(cdiv(N, BLOCK_M))", "range(N // BLOCK_M)")


def test_a_build_run_resumes_with_its_recorded_program(tmp_path):
    """`flashgen generate --resume N` of a build run goes on with the user's program (recorded with the run), not
    with an unknown provider 'user'; a finished one writes its files again."""
    home = tmp_path / "home"
    out = tmp_path / "built"
    done = flashgen("build", str(EXAMPLE), "--gpu", "a100", "--dtype", "fp16", "--out", str(out), home=home,
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run,) = Store(home).runs()
    assert run.meta["provider"]["program"] == EXAMPLE.read_text() and run.meta["provider"]["custom"] is True
    again = tmp_path / "again"
    resumed = flashgen("generate", "--resume", str(run.id), "--out", str(again), home=home, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "unknown provider" not in resumed.stderr and "Traceback" not in resumed.stderr + resumed.stdout
    assert (again / "kernel.cu").read_text() == (out / "kernel.cu").read_text()
    assert f"run {run.id} had already ended" in resumed.stderr


def test_a_program_wrong_on_the_cpu_fails_in_one_line_and_is_recorded(tmp_path):
    home = tmp_path / "home"
    bad = tmp_path / "tail.tl"
    bad.write_text(_variant_of(EXAMPLE.read_text(), TAIL_BUG))
    done = flashgen("build", str(bad), "--gpu", "a100", "--dtype", "fp16", "--out", str(tmp_path / "o"), home=home,
                    cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr + done.stdout
    errors = [line for line in _stderr_lines(done) if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no kernel: ")
    assert f"{bad} needs repair and no --provider was given" in errors[0] and "NaN" in errors[0]
    assert "on the CPU" in errors[0] and "N=77" in errors[0]
    (run,) = Store(home).runs()
    assert run.status == "failed" and f"(run {run.id};" in errors[0]
    assert not (tmp_path / "o" / "kernel.cu").exists()  # nothing compiled: the CPU caught it


def test_a_provider_repairs_the_program_from_the_cpu_feedback(tmp_path):
    """With a model (here a scripted one) the loop's feedback rounds repair the program: the fix is checked against
    the user's program where that defines something (its rows that it writes), then translated and compiled."""
    import flashgen
    from flashgen.agent.providers import ScriptedProvider

    fixed = EXAMPLE.read_text()
    model = ScriptedProvider([f"The tail fixed:\n\n```tl\n{fixed}```\n"], model="scripted-fixer")
    kernel = flashgen.build(_variant_of(fixed, TAIL_BUG), gpu="a100", dtype="fp16", provider=model, name="tail.tl")
    assert [r.stage for r in model.requests] == ["repair_interpret"]  # the program's own steps asked no model
    assert "NaN" in model.requests[0].messages[-1].content
    assert parse(kernel.tl) == parse(fixed) and SCORE in kernel.source
    assert kernel.meta["generation"]["provider"] == "user+scripted"
    # a rewrite that changes what the program computes where it is defined is refused on the CPU
    plain = _variant_of(fixed, ("          Compute S_r = S_r - log2e * 0.5 * " + SCORE + "\n", ""))
    wrong = ScriptedProvider([f"```tl\n{plain}```\n"] * 2)
    with pytest.raises(FlashgenError, match="no kernel"):
        flashgen.build(_variant_of(fixed, TAIL_BUG), gpu="a100", dtype="fp16", provider=wrong, max_iters=4)
    assert [r.stage for r in wrong.requests][:2] == ["repair_interpret", "repair_interpret"]


def test_without_a_model_the_translator_and_compiler_feedback_end_the_run_in_one_line():
    """The user's provider without a model: a program the translator refuses, and nvcc's errors on its CUDA, become
    the one-line reason the run fails with (NoFurtherReply), naming the file and the first error."""
    from flashgen import prompts
    from flashgen.agent.messages import ChatMessage, ModelRequest, NoFurtherReply, Task
    from flashgen.agent.user import UserProgramProvider, feedback_line
    from flashgen.prompts.rules import rules_for
    from flashgen.targets import get_target
    from flashgen.translators.cexpr import UnsupportedConstruct
    from flashgen.variant import DType, Variant

    class Refusing:  # the Environment's two methods the translation step uses
        def target(self, name):
            return get_target(name)

        def translate(self, tl, target):
            raise UnsupportedConstruct("kernel.tl:40:11: `Compute S_r = foo(S_r)`: no such function")

    text = EXAMPLE.read_text()
    task = Task(variant=Variant(causal=True, return_lse=True), target="a100", arch="sm_80", dtype=DType.fp16,
                head_dim=64)
    user = UserProgramProvider(text, "my.tl", env=Refusing())
    opening = ModelRequest(stage="params", phase="params", task=task, messages=[ChatMessage(role="user", content="x")])
    assert "```tl\n" + text.rstrip() + "\n```" in user.complete(opening).text
    asked = ModelRequest(stage="translate", phase="translate", task=task,
                         messages=[ChatMessage(role="user", content=f"```tl\n{text}```")])
    with pytest.raises(NoFurtherReply, match=r"^the translator cannot build my.tl for sm_80: kernel.tl:40:11: "):
        user.complete(asked)

    a100 = get_target("a100")
    nvcc = ('kernel.cu(12): warning #177-D: variable "y" was declared but never referenced\n'
            'kernel.cu(31): error: identifier "qpos" is undefined\n1 error detected in the compilation of "kernel.cu".')
    prompt = prompts.render("repair_compile", target=a100, rules=rules_for("repair_compile", a100, DType.fp16, task.variant),
                            feedback=nvcc, manifest_errors=[])
    line = feedback_line(prompt)
    assert line.startswith("its CUDA does not build for sm_80") and 'kernel.cu(31): error: identifier "qpos"' in line
    assert "\n" not in line and "Keep to" not in line and "Fix it" not in line and "warning" not in line
    repair = ModelRequest(stage="repair_compile", phase="translate", task=task,
                          messages=[ChatMessage(role="user", content=prompt)])
    with pytest.raises(NoFurtherReply, match=r"^my.tl needs repair and no --provider was given to repair it: its CUDA"):
        user.complete(repair)
