"""New hardware (flashgen/target_files.py): target files validated in one line, `flashgen targets add`,
`--targets FILE.toml` on any command, `flashgen targets detect` from a device's properties (fakes here; without a
GPU it says so in one line), peaks from the arch's per-SM rates."""

from __future__ import annotations

import json

import pytest

from flashgen.errors import UsageError
from flashgen.target_files import detected_toml, parse_target_file
from flashgen.targets import SM_RATES, TARGETS, get_target

GOOD = """name = "h200clone"
marketing_name = "NVIDIA H200 Clone"
compute_capability = [9, 0]
sm_count = 132
boost_clock_mhz = 1830
l2_mb = 60
mem_bandwidth_gbs = 4800
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))
    saved = dict(TARGETS)
    yield tmp_path
    for name in set(TARGETS) - set(saved):  # targets registered by a test leave with it
        from flashgen import targets

        target = TARGETS.pop(name)
        targets._TARGET_LIST.remove(target)
        for label, known in list(targets._LOOKUP.items()):
            if known is target:
                del targets._LOOKUP[label]
    from flashgen import targets

    targets._user_targets_read.clear()


def test_peaks_follow_from_the_arch_rates_and_match_the_table():
    target = parse_target_file(GOOD).to_target()
    h200 = get_target("h200")
    assert target.arch == "sm_90" and target.has_tma and target.mma == h200.mma
    assert target.smem_per_block_bytes == h200.smem_per_block_bytes and target.l2_bytes == h200.l2_bytes
    for dtype in ("fp16", "bf16", "tf32"):
        assert target.peak_tflops[dtype] == pytest.approx(h200.peak_tflops[dtype], rel=0.002), dtype
    assert abs(target.l2_bandwidth_gbs - h200.l2_bandwidth_gbs) / h200.l2_bandwidth_gbs < 0.01
    # every table GPU's tensor peak is its arch's per-SM rate x SMs x clock (GeForce: half, fp32 accumulate)
    for t in TARGETS.values():
        half = 0.5 if "geforce" in t.marketing_name.lower() else 1.0
        want = SM_RATES[t.arch]["fp16"] * half * t.sm_count * t.boost_clock_mhz / 1e6
        assert t.peak_tflops["fp16"] == pytest.approx(want, rel=0.02), t.name


@pytest.mark.parametrize("edit, message", [
    (lambda s: s + "sm_cont = 3\n", "unknown key 'sm_cont'"),
    (lambda s: s.replace("sm_count = 132\n", ""), "missing key 'sm_count'"),
    (lambda s: s.replace("[9, 0]", "[12, 0]"), "compute capability 12.0: flashgen has no translator backend"),
    (lambda s: s.replace("sm_count = 132", "sm_count = -1"), "sm_count: must be greater than 0"),
    (lambda s: s.replace('"h200clone"', '"H200 clone"'), "name:"),
    (lambda s: s + "l2_bytes = 5\n", "give the L2 size once"),
    (lambda s: s.replace("= 4800", "= 4800,"), "not TOML"),
])
def test_a_bad_target_file_is_one_line(edit, message):
    with pytest.raises(UsageError) as caught:
        parse_target_file(edit(GOOD), "gpu.toml")
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_targets_add_keeps_the_file_for_later_commands(home, capsys):
    from flashgen.cli import main

    path = home / "clone.toml"
    path.write_text(GOOD)
    main(["targets", "add", str(path)])
    assert "added h200clone" in capsys.readouterr().out
    assert (home / "home" / "config" / "targets" / "h200clone.toml").is_file()
    from flashgen import targets

    clone = targets.TARGETS.pop("h200clone")
    targets._TARGET_LIST.remove(clone)
    for label in [k for k, v in targets._LOOKUP.items() if v is clone]:
        del targets._LOOKUP[label]
    targets._user_targets_read.clear()
    assert get_target("h200clone").sm_count == 132  # read back from the user's folder on the first miss
    path.write_text(GOOD.replace('"NVIDIA H200 Clone"', '"NVIDIA H200"'))
    with pytest.raises(SystemExit) as stop:
        main(["targets", "add", str(path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "already the target 'h200' (built in)" in err and err.count("\n") == 1
    path.write_text(GOOD.replace("sm_count = 132", "sm_count = 114"))  # the user's own file again: replaced
    main(["targets", "add", str(path)])
    assert get_target("h200clone").sm_count == 114 and get_target("NVIDIA H200 Clone").sm_count == 114


def test_targets_option_on_any_command_and_a_library_for_the_new_gpu(home, capsys):
    from flashgen.cli import main
    from flashgen.library import parse_spec, plan

    path = home / "clone.toml"
    path.write_text(GOOD)
    main(["targets", "h200clone", "--json", "--targets", str(path)])
    assert json.loads(capsys.readouterr().out)["arch"] == "sm_90"
    spec = parse_spec({"gpus": ["h200clone"], "dtypes": ["bf16"], "variants": ["causal"], "head_dims": [128],
                       "tuned": "packaged"})
    (entry,) = plan(spec)
    assert entry.backend == "sm90" and entry.parameters["BLOCK_M"] > 0  # the backend follows from the capability


FAKE_H200 = {"name": "NVIDIA H200", "major": 9, "minor": 0, "sm_count": 132, "smem_per_sm_bytes": 233472,
             "smem_per_block_bytes": 232448, "l2_bytes": 62914560, "regs_per_sm": 65536, "max_threads_per_sm": 2048,
             "max_blocks_per_sm": 32, "clock_khz": 1980000, "memory_clock_khz": 3201000, "memory_bus_bits": 6144}


def test_detect_writes_a_file_that_loads_and_marks_what_it_could_not_read():
    text, missing = detected_toml(FAKE_H200)
    assert missing == []
    target = parse_target_file(text.replace('"nvidiah200"', '"h200b"').replace('"NVIDIA H200"', '"NVIDIA H200 B"'))
    assert target.to_target().mem_bandwidth_gbs == pytest.approx(4917, abs=2)  # 2 x 3201 MHz x 6144 bit / 8
    assert target.to_target().peak_tflops["bf16"] == pytest.approx(4096 * 132 * 1.98 / 1000, rel=0.001)
    partial = {k: v for k, v in FAKE_H200.items() if k not in ("clock_khz", "memory_clock_khz")}
    text, missing = detected_toml(partial)
    assert missing == ["boost_clock_mhz", "mem_bandwidth_gbs"] and text.count("FILL IN") == 2
    with pytest.raises(UsageError, match="missing key 'boost_clock_mhz'"):
        parse_target_file(text)


def test_detect_without_a_gpu_is_one_line(capsys, monkeypatch):
    from flashgen import target_files
    from flashgen.cli import main

    monkeypatch.setattr(target_files, "_read_with_cupy", lambda device: (_ for _ in ()).throw(ImportError("no cupy")))
    monkeypatch.setattr(target_files, "_read_with_cuda_python",
                        lambda device: (_ for _ in ()).throw(ImportError("no cuda-python")))
    with pytest.raises(SystemExit) as stop:
        main(["targets", "detect"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: no GPU here to detect") and err.count("\n") == 1
