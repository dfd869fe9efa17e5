import pytest
from typer.testing import CliRunner

from flashgen.errors import UsageError
from flashgen.targets import TARGETS, get_target

# Dense tensor flop per clock per SM with fp32 accumulate (architecture whitepapers): Turing 1024,
# GA100 2048, GA10x/Ada 1024 on data-center parts but 512 on GeForce (half-rate fp32 accumulate),
# Hopper 4096. FP32 lanes per SM: 64 on sm_75/sm_80, 128 on sm_86/89/90.
TENSOR_FLOP_PER_CLK = {"t4": 1024, "rtx8000": 1024, "a100": 2048, "a10": 1024, "rtx3090": 512, "l4": 1024,
                       "rtx4090": 512, "h100": 4096, "h200": 4096}
FP32_LANES = {"sm_75": 64, "sm_80": 64, "sm_86": 128, "sm_89": 128, "sm_90": 128}


def test_table_has_every_required_gpu():
    assert set(TARGETS) == set(TENSOR_FLOP_PER_CLK)


@pytest.mark.parametrize("alias,key", [
    ("H100-SXM", "h100"), ("h100 sxm5", "h100"), ("rtx8000", "rtx8000"), ("Quadro RTX 8000", "rtx8000"),
    ("4090", "rtx4090"), ("3090", "rtx3090"), ("NVIDIA A100", "a100"), ("t4", "t4"), ("H200", "h200"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("l4", "l4"), ("A10", "a10")])
def test_get_target_aliases(alias, key):
    assert get_target(alias).name == key


def test_unknown_target_is_a_one_line_usage_error():
    with pytest.raises(UsageError) as info:
        get_target("v100")
    message = str(info.value)
    assert "\n" not in message and "'v100'" in message and all(name in message for name in TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_targets_are_self_consistent(name):
    t = TARGETS[name]
    assert t.arch == f"sm_{t.compute_capability[0]}{t.compute_capability[1]}"
    assert t.smem_per_block_bytes <= t.smem_per_sm_bytes and t.l2_bytes > 0
    assert t.has_bf16_mma == ("bf16" in t.tensor_dtypes) == ("bf16" in t.peak_tflops)
    assert ("tf32" in t.tensor_dtypes) == ("tf32" in t.peak_tflops)
    assert t.has_cp_async == (t.compute_capability >= (8, 0))
    wgmma = [s for s in t.mma if s.instruction.startswith("wgmma")]
    assert bool(wgmma) == (t.arch == "sm_90") and all(s.requires_arch == "sm_90a" and s.m == 64 for s in wgmma)
    # the datasheet peaks agree with SM count x per-SM rate x boost clock (catches a typo in any one)
    tensor = t.sm_count * TENSOR_FLOP_PER_CLK[name] * t.boost_clock_mhz * 1e6 / 1e12
    assert t.peak_tflops["fp16"] == pytest.approx(tensor, rel=0.01)
    if t.arch != "sm_90":  # Hopper's FP32 figure is quoted at the 1980 MHz max boost
        fma = t.sm_count * FP32_LANES[t.arch] * 2 * t.boost_clock_mhz * 1e6 / 1e12
        assert t.peak_tflops["fp32"] == pytest.approx(fma, rel=0.01)


def test_known_numbers():
    h200 = get_target("h200")
    assert (h200.sm_count, h200.mem_bandwidth_gbs, h200.peak_tflops["bf16"]) == (132, 4800, 989.5)
    assert h200.l2_bytes == 60 * 2**20 and h200.measured == {"bf16_gemm_tflops": 702.0, "copy_gbs": 4270.0}
    t4 = get_target("t4")
    assert t4.mma[0].instruction == "mma.sync.aligned.m16n8k8" and t4.mma[0].input_dtypes == ("fp16",)
    assert get_target("a100").smem_per_block_bytes == 163 * 1024


def test_targets_cli():
    from flashgen.cli import app

    runner = CliRunner(env={"COLUMNS": "200"})
    table = runner.invoke(app, ["targets"])
    assert table.exit_code == 0 and "rtx8000" in table.output and "989.5" in table.output
    one = runner.invoke(app, ["targets", "h100-sxm"])
    assert one.exit_code == 0 and "wgmma" in one.output
    assert '"h200"' in runner.invoke(app, ["targets", "--json"]).output
    bad = runner.invoke(app, ["targets", "nope"])
    assert isinstance(bad.exception, UsageError)


# L2 bytes/clock/SM of the measured part each derived target is scaled from ([L2RULE] in targets.py):
# V100 2544 GB/s / (80 SMs x 1.38 GHz), L40 5200 GB/s / (142 SMs x 2.49 GHz).
L2_RULE = {"t4": 2544 / (80 * 1.38), "rtx8000": 2544 / (80 * 1.38), "a10": 5200 / (142 * 2.49),
           "rtx3090": 5200 / (142 * 2.49), "l4": 5200 / (142 * 2.49), "rtx4090": 5200 / (142 * 2.49)}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_l2_bandwidth(name):
    t = TARGETS[name]
    # an L2 slower than DRAM, or faster than shared memory, is a typo
    assert t.mem_bandwidth_gbs < t.l2_bandwidth_gbs < t.shared_bytes_per_clk_per_sm * t.sm_count * t.boost_clock_mhz / 1e3
    if name in L2_RULE:
        assert t.l2_bandwidth_gbs == pytest.approx(L2_RULE[name] * t.sm_count * t.boost_clock_mhz / 1e3, rel=0.005)
    else:  # measured [GPUB]
        assert t.l2_bandwidth_gbs == {"a100": 5400, "h100": 9700, "h200": 9700}[name]
