import math
import statistics
from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from flashgen.harness.bench import (
    attention_counts,
    fa2_suite,
    is_undertimed,
    parse_shapes,
    roofline_percent,
    tflops,
    time_in_rounds,
    timing_stats,
)
from flashgen.variant import DType, Shape, Variant


def test_median_and_quartiles():
    stats = timing_stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (stats.median_ms, stats.q1_ms, stats.q3_ms, stats.min_ms) == (3.0, 2.0, 4.0, 1.0)
    assert stats.reps == 5 and math.isclose(stats.mean_ms, 3.0)
    even = timing_stats([1.0, 2.0, 3.0, 10.0])
    assert even.median_ms == 2.5 and math.isclose(even.q1_ms, 1.75) and math.isclose(even.q3_ms, 4.75)
    with pytest.raises(ValueError):
        timing_stats([])


def test_tflops_arithmetic():
    shape = Shape(B=8, H=16, N=2048, M=2048, D=128)
    flops = 4 * 8 * 16 * 2048 * 2048 * 128
    assert math.isclose(tflops(shape, False, 1.0), flops / 1e-3 / 1e12)
    assert math.isclose(tflops(shape, True, 1.0), flops / 2 / 1e-3 / 1e12)
    with pytest.raises(ValueError):
        tflops(shape, False, 0.0)


def test_undertiming_flag():
    assert not timing_stats([1.0, 1.0], host_ms_per_call=1.05).undertimed  # launch + sync overhead is fine
    assert not is_undertimed(0.01, 0.15)  # a tiny kernel's host time is mostly overhead
    flagged = timing_stats([0.01, 0.01], host_ms_per_call=5.0)
    assert flagged.undertimed and "outside the timed stream" in flagged.note


def test_rounds_alternate_who_goes_first_and_pool_the_samples():
    """A fake timer: each call of a run gives one sample, its position in the whole sequence, so a kernel timed first
    in every round would read low; alternating, ours and the last baseline trade places and their medians meet."""
    calls: list[str] = []

    def timer(fn):
        calls.append(fn())
        return [float(len(calls))], 0.5 * len(calls)

    runs = [("ours", lambda: "ours"), ("flash", lambda: "flash"), ("cudnn", lambda: "cudnn")]
    stats = time_in_rounds(runs, 4, timer)
    assert calls == ["ours", "flash", "cudnn", "cudnn", "flash", "ours"] * 2
    assert [s.reps for s in stats.values()] == [4, 4, 4] and all(s.rounds == 4 for s in stats.values())
    assert stats[0].median_ms == stats[2].median_ms == 6.5 and stats[1].median_ms == 6.5
    assert math.isclose(stats[0].host_ms_per_call, 0.5 * statistics.fmean([1, 6, 7, 12]))
    # each round's median in round order: ours ran 1st, 6th, 7th and 12th, the last baseline the reverse
    assert stats[0].round_medians_ms == [1.0, 6.0, 7.0, 12.0] and stats[2].round_medians_ms == [3.0, 4.0, 9.0, 10.0]
    one = time_in_rounds(runs[:1], 1, lambda fn: ([2.0, 1.0], 3.0))[0]
    assert (one.reps, one.median_ms, one.rounds) == (2, 1.5, 1)


def test_the_card_settles_on_the_first_run_before_any_sample():
    """`settle` runs the first run untimed before the first round, once a shape (bench_kernels' settle_s): the card
    then reaches its clock under the power cap before the first sample of whichever kernel is listed first."""
    events: list[str] = []

    def timer(fn):
        events.append(f"timed {fn()}")
        return [1.0], 1.0

    runs = [("ours", lambda: "ours"), ("cudnn", lambda: "cudnn")]
    time_in_rounds(runs, 2, timer, settle=lambda fn: events.append(f"settled {fn()}"))
    assert events == ["settled ours", "timed ours", "timed cudnn", "timed cudnn", "timed ours"]
    events.clear()
    time_in_rounds(runs, 2, timer)
    assert not any(e.startswith("settled") for e in events)

    def settle_fails(fn):
        raise RuntimeError("illegal address")

    stats = time_in_rounds(runs, 2, timer, settle=settle_fails)
    assert isinstance(stats[0], RuntimeError) and stats[1].reps == 2  # the first run fails as its timing would


def test_each_timing_follows_its_own_warm_block_where_asked():
    """`warm` (bench_kernels' settle_each) runs a run untimed right before each of its timings, so that no block
    follows another kernel's (BENCH_SETTLE_EACH says why); the first run's settle still comes first, once; a warm
    block that fails fails its run as the timing would have."""
    events: list[str] = []

    def timer(fn):
        events.append(f"timed {fn()}")
        return [1.0], 1.0

    runs = [("ours", lambda: "ours"), ("cudnn", lambda: "cudnn")]
    time_in_rounds(runs, 2, timer, settle=lambda fn: events.append(f"settled {fn()}"),
                   warm=lambda fn: events.append(f"warmed {fn()}"))
    assert events == ["settled ours", "warmed ours", "timed ours", "warmed cudnn", "timed cudnn",
                      "warmed cudnn", "timed cudnn", "warmed ours", "timed ours"]

    def warm_fails(fn):
        if fn() == "cudnn":
            raise RuntimeError("cudnn fell over")

    stats = time_in_rounds(runs, 2, timer, warm=warm_fails)
    assert stats[0].reps == 2 and isinstance(stats[1], RuntimeError)


def test_a_run_that_fails_is_reported_and_not_timed_again():
    seen: list[str] = []

    def timer(fn):
        name = fn()
        seen.append(name)
        if name == "flex":
            raise RuntimeError("flex fell over")
        return [1.0], 1.0

    stats = time_in_rounds([("ours", lambda: "ours"), ("flex", lambda: "flex")], 3, timer)
    assert isinstance(stats[1], RuntimeError) and seen.count("flex") == 1
    assert stats[0].reps == 3 and seen == ["ours", "flex", "ours", "ours"]


def test_shapes_and_suite():
    shapes = parse_shapes("B=8,H=16,N=2048,M=1024,D=128; B=2,H=4,N=100,D=64")
    assert shapes[0].M == 1024 and shapes[1].M == 100
    with pytest.raises(ValueError):
        parse_shapes("B=1,H=x")
    suite = fa2_suite()
    assert len(suite) == 2 * 2 * 2 * 6
    assert all(s.B * s.N == 16384 and s.H * s.D == 2048 and s.N == s.M for _, _, s in suite)


def test_roofline_percent_uses_the_target():
    shape = Shape(B=4, H=16, N=4096, M=4096, D=128)
    counts = attention_counts(shape, Variant(causal=True), DType.bf16)
    assert counts.mma_flops == shape.flops(True)
    pct = roofline_percent(shape, Variant(causal=True), DType.bf16, "h100", 1.0)
    assert pct is not None and 0 < pct < 100
    assert roofline_percent(shape, Variant(), DType.bf16, None, 1.0) is None


def test_speedup_is_baseline_time_over_ours():
    from flashgen.harness.bench import speedup

    assert speedup(2.0, 1.0) == 2.0  # the baseline takes twice as long: ours is 2x faster
    assert speedup(1.0, 4.0) == 0.25
    with pytest.raises(ValueError):
        speedup(0.0, 1.0)


def test_geomean():
    from flashgen.harness.bench import geomean

    assert math.isclose(geomean([2.0, 0.5]), 1.0)  # 2x faster and 2x slower cancel
    assert math.isclose(geomean([1.0, 4.0, 16.0]), 4.0)
    assert geomean([]) is None
    with pytest.raises(ValueError):
        geomean([1.0, -1.0])


def test_bench_rejects_an_unknown_flex_mode():
    from flashgen.harness.bench import bench_kernels

    with pytest.raises(ValueError, match="flex must be one of"):
        bench_kernels([], [], flex="sometimes")


@pytest.mark.parametrize("settle_each", [False, True])
def test_every_kernel_of_a_shape_is_timed_in_the_same_rounds(monkeypatch, settle_each):
    """bench_kernels on a fake device (no GPU): two kernels and a baseline at one shape are timed round by round
    together, the order reversed every other round, so a clock that drifts during the run moves them alike; a
    kernel built for another head dim is skipped at that shape, and a second shape gets rounds of its own. With
    settle_each, each timing follows an untimed block of its own run, as long as the timed one; the report keeps
    how it timed."""
    import contextlib
    import types
    from pathlib import Path

    from flashgen.abi import KernelManifest
    from flashgen.harness import bench, device

    manifest = KernelManifest.model_validate_json(
        (Path(__file__).resolve().parents[1] / "generated/h200/bf16/plain_d128/manifest.json").read_text())
    first, second = (manifest.model_copy(update={"name": name}) for name in ("fg_first", "fg_second"))
    other_dim = manifest.model_copy(update={"name": "fg_d64", "head_dim": 64})
    fake_cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=lambda non_blocking: "stream"),
                                    empty=lambda shape, dtype=None: ("empty", shape), float32="float32")
    monkeypatch.setattr(device, "_cupy", lambda: fake_cp)
    monkeypatch.setattr(device, "environment_info", lambda: {"gpu": "NVIDIA H200", "l2_bytes": 1 << 20})
    monkeypatch.setattr(device, "ensure_compiled", lambda kernel, arch: (types.SimpleNamespace(
        model_dump=lambda exclude: {"ok": True}), f"{kernel.manifest.name}.cubin"))
    monkeypatch.setattr(device, "runnable_arch", lambda man: "sm_90a")
    monkeypatch.setattr(device, "load_kernel", lambda cubin, man: man.name)
    monkeypatch.setattr(device, "prepare_launch", lambda man, loaded, *a, step, **kw: lambda: f"{loaded} {step}")
    monkeypatch.setattr(bench, "_random_device", lambda cp, shape, dtype, seed: types.SimpleNamespace(dtype=dtype))
    monkeypatch.setattr(bench, "_call_time_inputs", lambda cp, man, shape, seed: (None, None))

    @contextlib.contextmanager
    def baseline_runs(variant, dtype, shape, *args):
        entry = bench.BenchEntry(name="sdpa_cudnn", kind="baseline", dtype=dtype.value, variant=variant.name,
                                 shape=shape, ok=False)
        yield [(entry, lambda: f"sdpa_cudnn bench {bench.shape_text(shape)}")]

    monkeypatch.setattr(bench, "_baseline_runs", baseline_runs)
    calls: list[str] = []

    def time_samples(fn, **kwargs):
        calls.append(fn())
        return [float(len(calls))], 0.1

    monkeypatch.setattr(bench, "time_samples", time_samples)
    monkeypatch.setattr(bench, "settle_card", lambda fn, seconds, stream: calls.append(f"untimed {seconds:g} s"))
    shapes = [Shape(B=1, H=2, N=256, M=256, D=128), Shape(B=1, H=2, N=512, M=512, D=128)]
    report = bench.bench_kernels([device.KernelInput(manifest=m, source="//") for m in (first, other_dim, second)],
                                 shapes, rounds=2, flex="off", min_time_s=0.2, settle_each=settle_each)
    small, large = (bench.shape_text(s) for s in shapes)
    group = [f"fg_first bench {small}", f"sdpa_cudnn bench {small}", f"fg_second bench {small}"]
    group_large = [g.replace(small, large) for g in group]
    timings = [c for c in calls if not c.startswith("untimed")]
    assert timings == group + group[::-1] + group_large + group_large[::-1]
    # a timing's block is min_time_s / rounds; its warm block as long
    assert calls == ([c for t in timings for c in ("untimed 0.1 s", t)] if settle_each else timings)
    assert report.settings == {"min_time_s": 0.2, "rounds": 2, "settle_s": 0.0, "settle_each": settle_each,
                               "baselines": True, "flex": "off"}
    timed = [(e.name, e.stats.reps) for e in report.entries if e.stats is not None]
    assert timed == [("fg_first", 2), ("sdpa_cudnn", 2), ("fg_second", 2)] * 2
    skipped = [e for e in report.entries if e.name == "fg_d64"]
    assert len(skipped) == 2 and all(e.skipped == "kernel is built for D=64" and not e.ok for e in skipped)
    assert all(e.tflops and e.tflops > 0 for e in report.entries if e.stats is not None)


def _fake_cupy(clock: list[float]) -> SimpleNamespace:
    """cupy's few calls time_samples makes, on a fake clock: each event takes the clock's time when recorded, and a
    call of the timed fn advances the clock by the kernel's time (the events' span) plus, on the host, whatever
    else the call waits for."""

    class Event:
        def record(self, stream=None):
            self.t = clock[0]

    runtime = SimpleNamespace(getDeviceProperties=lambda device: {"l2CacheSize": 1 << 20},
                              deviceSynchronize=lambda: None)
    cuda = SimpleNamespace(Event=Event, runtime=runtime, Device=lambda: SimpleNamespace(id=0),
                           get_current_stream=nullcontext, get_elapsed_time=lambda start, end: end.t - start.t)
    return SimpleNamespace(cuda=cuda, uint32="uint32", empty=lambda n, dtype: SimpleNamespace(fill=lambda value: None))


@pytest.mark.parametrize("waits, flagged", [((0.0, 0.0, 9.0), False),  # another process's kernel, now and then
                                            ((9.0, 9.0, 9.0), True)])  # work hidden on another stream, every call
def test_the_host_cross_check_takes_the_fastest_synchronized_call(monkeypatch, waits, flagged):
    """A 1 ms kernel that the host sees take 10 ms on some calls: beside other processes on the same GPU (the GPU
    tests run in parallel) it is not flagged; where every call waits 9 ms more than its events say, it is."""
    from flashgen.harness import bench, device

    clock = [0.0]
    calls = [0]

    def fn():
        calls[0] += 1
        clock[0] += 1.0 + waits[calls[0] % 3] * (calls[0] > 13)  # the host timing's calls come after 3 + 10

    monkeypatch.setattr(device, "_cupy", lambda: _fake_cupy(clock))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0] / 1e3)
    stats = bench.time_callable(fn, min_reps=10, max_reps=10, host_reps=6)
    assert stats.median_ms == 1.0 and stats.reps == 10
    assert math.isclose(stats.host_ms_per_call, 10.0 if flagged else 1.0) and stats.undertimed is flagged
