import pytest

from flashgen.roofline import OpCounts, attention_flops, estimate, percent_of_roofline
from flashgen.targets import get_target
from flashgen.variant import DType, Shape


def test_each_term_by_hand_on_a100():
    a100 = get_target("a100")  # 312 TFLOP/s fp16, 19.5 FP32, 2039 GB/s, 108 SMs at 1.41 GHz
    sfu_rate = 16 * 108 * 1.41e9
    shared_rate = 128 * 108 * 1.41e9
    counts = OpCounts(mma_flops=312e12, vector_flops=19.5e12 / 2 * 0.5, sfu_ops=sfu_rate * 0.25,
                      bytes={"global_read": 2039e9 * 0.5, "global_write": 2039e9 * 0.25, "shared_read": shared_rate * 0.125})
    est = estimate(counts, a100, DType.fp16)
    assert est.tensor_s == pytest.approx(1.0) and est.vector_s == pytest.approx(0.5)
    assert est.sfu_s == pytest.approx(0.25) and est.memory_s == pytest.approx(0.75)
    assert est.shared_s == pytest.approx(0.125)
    assert est.bound == "tensor" and est.time_s == pytest.approx(1.0)
    assert est.serial_time_s == pytest.approx(2.625) and est.tensor_dtype == "fp16" and est.tensor_note is None
    assert est.tflops_at_bound(156e12) == pytest.approx(156.0)


def test_memory_bound_and_measured_ceiling_on_h200():
    h200 = get_target("h200")
    counts = OpCounts(mma_flops=989.5e12 * 0.5, bytes={"global_read": 2.4e12, "global_write": 2.4e12})
    est = estimate(counts, h200, "bf16")
    assert est.bound == "memory" and est.time_s == pytest.approx(1.0)
    assert est.tflops_at_bound(989.5e12 * 0.5) == pytest.approx(494.75)
    measured = estimate(counts, h200, "bf16", ceiling="measured")
    assert measured.tensor_tflops == 702.0 and measured.memory_s == pytest.approx(4.8e12 / 4270e9)
    # a target without measurements falls back to the datasheet
    assert estimate(counts, get_target("a100"), "bf16", ceiling="measured").tensor_tflops == 312.0


def test_dtypes_the_tensor_cores_do_not_take():
    t4, a100 = get_target("t4"), get_target("a100")
    counts = OpCounts(mma_flops=65e12)
    bf16_t4 = estimate(counts, t4, "bf16")
    assert bf16_t4.tensor_dtype == "fp16" and "bf16" in bf16_t4.tensor_note and bf16_t4.tensor_s == pytest.approx(1.0)
    fp32_t4 = estimate(counts, t4, "fp32")
    assert fp32_t4.tensor_dtype == "fp32" and fp32_t4.tensor_s == pytest.approx(65 / 8.1)
    fp32_a100 = estimate(OpCounts(mma_flops=156e12), a100, DType.fp32)
    assert fp32_a100.tensor_dtype == "tf32" and fp32_a100.tensor_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="dtype"):
        estimate(counts, t4, "int8")


def test_attention_flops_and_percent():
    shape = Shape(B=2, H=4, N=1024, M=512, D=64)
    assert attention_flops(shape) == 4 * 2 * 4 * 1024 * 512 * 64
    assert attention_flops(shape, causal=True) == 2 * 2 * 4 * 1024 * 512 * 64
    est = estimate(OpCounts(mma_flops=312e12), get_target("a100"), "fp16")
    assert percent_of_roofline(4.0, est) == pytest.approx(25.0)
    with pytest.raises(ValueError):
        percent_of_roofline(0.0, est)
