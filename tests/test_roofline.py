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
    # the sm_75 translator converts fp32 tiles to scaled fp16 too (docs/turing-dtypes.md)
    assert fp32_t4.tensor_dtype == "fp16" and "fp32" in fp32_t4.tensor_note and fp32_t4.tensor_s == pytest.approx(1.0)
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


# ---------------------------------------------------------------------------------------------
# The memory term: compulsory DRAM bytes over HBM vs as-written bytes over L2
# ---------------------------------------------------------------------------------------------

def _interpreted(program_name: str, shape: Shape):
    from flashgen.tl_spec import library, parse
    from flashgen.tl_spec.interpreter import interpret

    return interpret(parse(library.load(program_name, "full"), f"{program_name}.full.tl"), shape, seed=0).counts


def test_interpreter_counts_causal_bytes_by_hand():
    """causal.full.tl (64x64 tiles, fp16, LSE fp32) at B=1, H=2, N=M=128, D=64. Per head: row block 0 reads
    Q (64*64*2 = 8192 B) and one K+V tile pair (16384 B), row block 1 reads Q and two pairs: 65536 B;
    two heads 131072 B read as written. Written: O 2 heads * 2 blocks * 8192 + LSE 2 * 2 * 64 * 4 = 33792 B.
    Compulsory: Q, K, V are 2*128*64*2 = 32768 B each (98304 read); O 32768 + LSE 1024 (33792 written)."""
    counts = _interpreted("causal", Shape(B=1, H=2, N=128, M=128, D=64))
    assert counts.bytes["global_read"] == 131072 and counts.bytes["global_write"] == 33792
    assert counts.bytes["dram_read"] == 98304 and counts.bytes["dram_write"] == 33792


def test_interpreter_counts_shared_kv_head_once():
    """gqa.full.tl with H=2 heads on KVH=1: both heads read the one K/V head as written, DRAM sees it once.
    Non-causal, N=M=128, 64x64 tiles: per head 2 row blocks * (Q 8192 + 2 K/V pairs * 16384) = 81920 B,
    163840 B for two heads. DRAM: Q 32768 + K 16384 + V 16384 = 65536 B."""
    counts = _interpreted("gqa", Shape(B=1, H=2, KVH=1, N=128, M=128, D=64))
    assert counts.bytes["global_read"] == 163840 and counts.bytes["dram_read"] == 65536
    assert counts.bytes["dram_write"] == counts.bytes["global_write"] == 32768 + 1024


def test_interpreter_counts_split_kv_workspace_both_ways():
    """decode_splitkv.full.tl (16x64 tiles, 4 splits) at B=1, H=2, N=16, M=256, D=64. Tensors: Q 4096 B,
    K and V 65536 B each, O 4096, LSE 128, workspace O_part 2*4*16*64*4 = 32768 and LSE_part 512 B.
    The partial kernel writes the workspace and the combine kernel reads it, so it counts both ways:
    DRAM read = Q + K + V + O_part + LSE_part = 168448 B, DRAM write = workspace + O + LSE = 37504 B.
    As written: partial reads per (head, split) Q 2048 + one K/V pair 16384 (8 of them: 147456), combine
    reads per (head, split) 64 + 4096 (33280): 180736 B; every output element is written once (37504 B)."""
    counts = _interpreted("decode_splitkv", Shape(B=1, H=2, N=16, M=256, D=64))
    assert counts.bytes["dram_read"] == 168448 and counts.bytes["dram_write"] == 37504
    assert counts.bytes["global_read"] == 180736 and counts.bytes["global_write"] == 37504


def test_memory_term_is_the_larger_of_dram_and_l2_on_h200():
    h200 = get_target("h200")  # 4800 GB/s HBM, 9700 GB/s L2
    l2_heavy = OpCounts(bytes={"global_read": 9.7e12 * 0.5, "global_write": 9.7e12 * 0.25,
                               "dram_read": 4.8e12 * 0.25, "dram_write": 4.8e12 * 0.125})
    est = estimate(l2_heavy, h200, "fp16")
    assert est.l2_s == pytest.approx(0.75) and est.dram_s == pytest.approx(0.375)
    assert est.memory_s == pytest.approx(0.75) and est.bound == "memory" and est.memory_note is None
    dram_heavy = OpCounts(bytes={"global_read": 9.7e12 * 0.1, "dram_read": 4.8e12 * 0.5})
    est = estimate(dram_heavy, h200, "fp16")
    assert est.dram_s == pytest.approx(0.5) and est.l2_s == pytest.approx(0.1) and est.memory_s == pytest.approx(0.5)
    # the measured copy ceiling replaces the HBM rate for the DRAM part only
    measured = estimate(dram_heavy, h200, "fp16", ceiling="measured")
    assert measured.dram_s == pytest.approx(4.8e12 * 0.5 / 4270e9) and measured.l2_s == pytest.approx(0.1)


def test_counts_without_dram_keys_keep_the_earlier_rule():
    a100 = get_target("a100")
    est = estimate(OpCounts(bytes={"global_read": 2039e9, "global_write": 2039e9}), a100, "fp16")
    assert est.memory_s == pytest.approx(2.0) and est.dram_s == pytest.approx(2.0) and est.l2_s is None
    assert est.memory_note and "dram_read" in est.memory_note


def test_library_causal_d128_on_h200_is_tensor_bound():
    """causal fp16 d128, 128x128 tiles (the measured sm_80-family choice), B=4, H=16, N=M=4096 on h200.
    One (batch, head) group is interpreted and scaled by 64, as the agent does. Per head: 32 row blocks,
    1+2+...+32 = 528 key tiles. By hand:
    - mma: 528 tiles * 2 GEMMs * 2*128*128*128 = 4.429e9 per head, 2.835e11 in all -> 0.2865 ms at 989.5 TFLOP/s.
    - as written: Q 1 MiB + 528 K/V pairs * 65536 B + O 1 MiB + LSE 16 KiB = 36716544 B per head, 2.350e9 B
      in all -> 0.2423 ms over 9700 GB/s of L2 (the earlier rule, over 4800 GB/s HBM, gave 0.4896 ms and
      called the kernel memory-bound).
    - compulsory: Q, K, V, O 1 MiB each + LSE 16 KiB = 4210688 B per head, 2.695e8 B -> 0.0561 ms of HBM.
    So the bound is the tensor term, 0.2865 ms: 959.6 TFLOP/s by the FlashAttention causal count."""
    from flashgen.tl_spec import library, parse
    from flashgen.tl_spec.interpreter import interpret
    from flashgen.variant import Variant

    text = library.render(Variant(causal=True, return_lse=True), dtype="fp16", arch="sm_90", head_dim=128,
                          params={"BLOCK_M": 128, "BLOCK_N": 128, "WARPS": 8, "STAGES": 1})
    one = interpret(parse(text, "causal_d128.tl"), Shape(B=1, H=1, N=4096, M=4096, D=128), seed=0).counts
    assert one.mma_flops == 528 * 2 * 2 * 128**3
    assert one.bytes["global_read"] + one.bytes["global_write"] == 36716544
    assert one.bytes["dram_read"] + one.bytes["dram_write"] == 4210688
    big = OpCounts(mma_flops=one.mma_flops * 64, vector_flops=one.vector_flops * 64, sfu_ops=one.sfu_ops * 64,
                   bytes={k: v * 64 for k, v in one.bytes.items()})
    est = estimate(big, get_target("h200"), "fp16")
    assert est.tensor_s == pytest.approx(0.2865e-3, rel=1e-3)
    assert est.l2_s == pytest.approx(0.2423e-3, rel=1e-3) and est.dram_s == pytest.approx(0.0561e-3, rel=1e-3)
    assert est.memory_s == est.l2_s and est.bound == "tensor" and est.time_s == est.tensor_s
    assert est.tflops_at_bound(attention_flops(Shape(B=4, H=16, N=4096, M=4096, D=128), causal=True)) \
        == pytest.approx(959.6, rel=1e-3)
    # without the DRAM keys the same counts fall back to the earlier, memory-bound verdict
    old = estimate(OpCounts(mma_flops=big.mma_flops, bytes={k: v for k, v in big.bytes.items()
                                                            if k.startswith("global")}), get_target("h200"), "fp16")
    assert old.bound == "memory" and old.memory_s == pytest.approx(0.4896e-3, rel=1e-3)


# ---------------------------------------------------------------------------------------------
# Only the visible work counts (window, causal, N != M): one count for the TF/s figures and the roofline
# ---------------------------------------------------------------------------------------------

def test_visible_work_matches_the_reference_mask():
    import itertools

    from flashgen.reference import visible_mask
    from flashgen.roofline import visible_work
    from flashgen.variant import Variant

    variants = [Variant(), Variant(causal=True), Variant(causal=True, window=1), Variant(causal=True, window=7),
                Variant(causal=True, window=500)]
    for n, m, v in itertools.product([1, 2, 9, 64, 100], [1, 3, 16, 64, 130], variants):
        mask = visible_mask(n, m, v)
        work = visible_work(v, n, m)
        assert (work.pairs, work.rows, work.keys) == (mask.sum(), mask.any(1).sum(), mask.any(0).sum()), (n, m, v)
        # the FLOP count takes FlashAttention's half for causal N = M, the exact count everywhere else
        assert work.counted_pairs == (n * m / 2 if v.causal and v.window is None and n == m else work.pairs)


def test_flops_count_only_what_the_mask_leaves():
    from flashgen.harness.bench import attention_counts, tflops
    from flashgen.variant import Variant

    big = Shape(B=4, H=16, N=4096, M=4096, D=128)
    window = Variant(causal=True, window=256)
    per_head = 4096 * 256 - 256 * 255 // 2  # rows 0..254 see fewer than 256 keys
    assert attention_flops(big, window) == 4 * 4 * 16 * 128 * per_head
    assert attention_flops(big, Variant(causal=True)) == attention_flops(big, True) == big.flops(True)
    assert attention_flops(big, Variant()) == big.flops(False)
    # causal with N != M is bottom-right aligned: N < M sees more than half, N > M less
    wide, tall = Shape(B=1, H=1, N=100, M=300, D=64), Shape(B=1, H=1, N=300, M=100, D=64)
    assert attention_flops(wide, Variant(causal=True)) == 4 * 64 * (100 * 300 - 100 * 99 // 2)
    assert attention_flops(tall, Variant(causal=True)) == 4 * 64 * (100 * 101 // 2)
    # the benchmark's TF/s and its roofline counts agree
    assert tflops(big, window, 1.0) == pytest.approx(attention_flops(big, window) / 1e-3 / 1e12)
    counts = attention_counts(big, window, DType.fp16)
    assert counts.mma_flops == attention_flops(big, window) and counts.sfu_ops == 4 * 16 * per_head
    # K/V rows no query sees are not compulsory reads: a short window over a long key sequence
    short = Shape(B=1, H=1, N=64, M=4096, D=64)
    reads = attention_counts(short, Variant(causal=True, window=64), DType.fp16).bytes["dram_read"]
    assert reads == (64 * 64 + 2 * 127 * 64) * 2


def test_a_windowed_kernel_is_not_above_the_peak():
    """The report's 'TFLOP/s at the bound' of a sliding-window kernel: 1610 TFLOP/s on an A100 (peak 312) while the
    FLOP count ignored the window."""
    from flashgen.agent.outputs import _roofline
    from flashgen.agent.providers import Task
    from flashgen.harness.environment import Environment
    from flashgen.tl_spec import library, parse
    from flashgen.tl_spec.interpreter import interpret
    from flashgen.variant import Variant

    variant = Variant(causal=True, window=128)
    a100 = get_target("a100")
    text = library.render(variant, dtype="fp16", arch="sm_80", head_dim=64,
                          params={"BLOCK_M": 64, "BLOCK_N": 64, "WARPS": 4, "STAGES": 1})
    shape = Shape(B=1, H=1, N=2048, M=2048, D=64)
    counts = interpret(parse(text, "window.tl"), shape, seed=0).counts
    payload = {**counts.model_dump(), "shape": "B=1,H=1,N=2048,M=2048,D=64"}
    task = Task(variant=variant, target="a100", arch="sm_80", dtype=DType.fp16, head_dim=64)
    roof = _roofline(payload, a100, task, Environment())
    assert 0 < roof["tflops_at_bound"] <= a100.peak_tflops["fp16"]
    assert shape.flops(True) / roof["time_s"] / 1e12 > a100.peak_tflops["fp16"]  # what the old count claimed
