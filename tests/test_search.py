"""Tile-parameter search on the CPU: the candidate space and its filters (TL checker, translator, nvcc
spills), the search driven by a fake timer and verifier, the tuned file read by choose_params, the
`flashgen tune` listing without a GPU, and the expert moving to the next candidate after slow feedback.
The real GPU timer (GpuTimer) is not exercised here."""

import json

import pytest
import typer
from typer.testing import CliRunner

from flashgen.errors import UsageError
from flashgen.harness import tune as tune_mod
from flashgen.harness.tune import Verdict, compile_filter, record_winner, search
from flashgen.translators import params as params_mod
from flashgen.translators import search as search_mod
from flashgen.translators.params import choose_params, choose_params_with_source, load_tuned
from flashgen.translators.search import CandidateRecord, candidate_params, screen_candidates
from flashgen.variant import DType, Shape, Variant

CAUSAL = Variant(causal=True)
SHAPES = [Shape(B=4, H=16, N=1024, M=1024, D=128), Shape(B=1, H=16, N=4096, M=4096, D=128)]


def test_candidates_pass_the_checker_and_come_likeliest_first():
    records = screen_candidates(CAUSAL, "t4", DType.fp16, 256)
    by_label = {r.label: r for r in records}
    # 128 query rows + 2 x 128 keys of d256 fp16 is 192 KB: over the T4's 64 KB per block
    busted = by_label["128x128 w8 s1 q1 g0"]
    assert busted.dropped.startswith("check:") and "shared memory" in busted.dropped
    assert "not a multiple of 16 * WARPS" in by_label["64x64 w8 s1 q1 g0"].dropped
    alive = [r for r in records if r.alive]
    assert alive and all(r.kernel_name and r.tl for r in alive)
    keys = [(not r.model.fits, -r.model.score) for r in alive]
    assert keys == sorted(keys)
    listed = candidate_params(CAUSAL, "t4", DType.fp16, 256)
    assert listed == [r.params for r in alive] and busted.params not in listed
    # a larger GPU admits more of the space, and the names tell the candidates apart
    a100 = [r for r in screen_candidates(CAUSAL, "a100", DType.bf16, 128) if r.alive]
    assert len(a100) > len(alive) and len({r.kernel_name for r in a100}) == len(a100)


def test_compile_filter_drops_the_candidate_that_spills():
    records = screen_candidates(CAUSAL, "a100", DType.bf16, 128)
    by_label = {r.label: r for r in records}
    # 128x64 with 4 warps and Q in registers holds 128 + 64 + 64 values per thread at d128: it spills hundreds of
    # bytes on sm_80; 128x128 w8 does not. The third is beyond the compile budget and never compiled.
    picked = [by_label["128x64 w4 s1 q1 g0"], by_label["128x128 w8 s1 q1 g0"], by_label["64x64 w4 s1 q1 g0"]]
    survivors = compile_filter(picked, "a100", max_compiles=2)
    assert [r.label for r in survivors] == ["128x128 w8 s1 q1 g0"]
    assert picked[0].resources[next(iter(picked[0].resources))]["spill_store_bytes"] > tune_mod.SPILL_TOLERANCE_BYTES
    assert "spills" in picked[0].dropped and picked[0].resources
    assert picked[1].resources and all(u["spill_store_bytes"] == 0 for u in picked[1].resources.values())
    assert picked[2].dropped == "compile: not compiled (compile budget)" and picked[2].source is None


class FakeTimer:
    """Times by candidate label (10 ms where not listed); records what it was asked to time."""

    name = "fake"

    def __init__(self, times: dict[str, list[float | None]], clock=None, step_s: float = 0.0):
        self.times, self.asked, self.clock, self.step_s = times, [], clock, step_s

    def __call__(self, kernels: list[CandidateRecord], shapes: list[Shape]) -> list[list[float | None]]:
        self.asked += [k.label for k in kernels]
        if self.clock is not None:
            self.clock[0] += self.step_s
        return [list(self.times.get(k.label, [10.0] * len(shapes))) for k in kernels]


def fake_verifier(wrong: set[str]):
    return lambda record: Verdict(ok=record.label not in wrong, summary="O differs" if record.label in wrong else "ok")


def _first_labels(n: int) -> list[str]:
    return [r.label for r in screen_candidates(CAUSAL, "a100", DType.bf16, 128) if r.alive][:n]


def test_search_picks_the_geomean_winner_and_never_a_wrong_kernel():
    a, b, c, d = _first_labels(4)
    # a: geomean 2.0 (mean 2.5); b: geomean 2.12 (mean 2.25): the geomean picks a. c is fastest but wrong.
    # d has no time at the second shape.
    timer = FakeTimer({a: [1.0, 4.0], b: [3.0, 1.5], c: [0.1, 0.1], d: [0.5, None]})
    result = search(CAUSAL, "a100", DType.bf16, 128, SHAPES, timer=timer, budget_s=60, compile=False,
                    verifier=fake_verifier({c}), max_candidates=4, batch_size=2)
    assert result.winner_label == a and result.winner_geomean_ms == pytest.approx(2.0)
    assert c not in timer.asked and set(timer.asked) == {a, b, d}
    by_label = {r.label: r for r in result.candidates}
    assert by_label[c].dropped.startswith("verify:") and by_label[d].dropped.startswith("time: no time at B=1")
    assert result.timer == "fake" and result.environment is None and len(result.shapes) == 2
    assert all(r.dropped for r in result.candidates if r.label not in (a, b))
    with pytest.raises(UsageError, match="verifier"):
        search(CAUSAL, "a100", DType.bf16, 128, SHAPES, timer=lambda k, s: [], budget_s=1, compile=False)


def test_search_stops_timing_when_the_budget_is_spent(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(tune_mod.time, "monotonic", lambda: clock[0])
    timer = FakeTimer({}, clock=clock, step_s=100.0)
    result = search(CAUSAL, "a100", DType.bf16, 128, SHAPES[:1], timer=timer, budget_s=150, compile=False,
                    verifier=fake_verifier(set()), max_candidates=4, batch_size=1)
    assert len(timer.asked) == 2 and len(result.timed) == 2 and result.winner is not None
    assert sum((r.dropped or "").startswith("budget: the time budget") for r in result.candidates) == 2


def test_tuned_file_round_trip_and_choose_params_prefers_it(tmp_path, monkeypatch):
    a, b = _first_labels(2)
    result = search(CAUSAL, "a100", DType.bf16, 128, SHAPES, timer=FakeTimer({b: [0.5, 0.5]}), budget_s=60,
                    compile=False, verifier=fake_verifier(set()), max_candidates=2)
    assert result.winner_label == b
    path = record_winner(result, tmp_path)
    assert path == tmp_path / "a100.json"
    entry = load_tuned("a100", tmp_path).entries["bf16/causal/d128"]
    assert entry.params == result.winner and entry.geomean_ms == pytest.approx(0.5) and entry.timer == "fake"
    measured = choose_params(CAUSAL, "a100", DType.bf16, 128)
    assert measured != result.winner  # so that the next line shows the tuned file winning
    choice = choose_params_with_source(CAUSAL, "a100", DType.bf16, 128, tuned_dir=tmp_path)
    assert choice.source == "tuned" and choice.params == result.winner and "a100.json" in choice.detail
    # an arch has no tuned file; another variant, dtype or head dim is not the tuned key (nothing is measured on
    # sm_80 itself: the defaults; sm_90 has its measured table)
    assert choose_params_with_source(CAUSAL, "sm_80", DType.bf16, 128, tuned_dir=tmp_path).source == "defaults"
    assert choose_params_with_source(CAUSAL, "sm_90", DType.bf16, 128, tuned_dir=tmp_path).source == "measured"
    assert choose_params_with_source(Variant(), "a100", DType.bf16, 128, tuned_dir=tmp_path).source == "defaults"
    assert choose_params_with_source(CAUSAL, "a100", DType.fp16, 96, tuned_dir=tmp_path).source == "defaults"
    monkeypatch.setattr(params_mod, "TUNED_DIR", tmp_path)
    assert choose_params(CAUSAL, "a100", DType.bf16, 128) == result.winner
    from flashgen.agent.environment import Environment

    env = Environment()
    target = env.target("a100")
    assert env.choose_params(CAUSAL, target, DType.bf16, 128)[0] == result.winner
    assert env.params_source(CAUSAL, target, DType.bf16, 128, result.winner)["source"] == "tuned"
    assert env.params_source(CAUSAL, target, DType.bf16, 128, {**result.winner, "BLOCK_N": 16})["source"] == "provider"
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not a tuned-parameters file"):
        choose_params(CAUSAL, "a100", DType.bf16, 128)


def _tune_app():
    from flashgen.harness.tune_cli import register

    app = typer.Typer()
    register(app)
    app.callback()(lambda: None)
    return app


def test_tune_without_gpu_lists_the_candidates_and_says_timing_needs_one(monkeypatch):
    import flashgen.harness.worker as worker

    monkeypatch.setattr(worker, "have_gpu", lambda: False)
    runner = CliRunner()
    out = runner.invoke(_tune_app(), ["tune", "--gpu", "a100", "--dtype", "bf16", "--head-dim", "128", "--causal",
                                      "--limit", "2"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    first = candidate_params(CAUSAL, "a100", DType.bf16, 128)[0]
    assert search_mod.params_label(first) in out.output and "roofline N=M=512" in out.output
    assert "from defaults" in out.output and "2 shown" in out.output
    assert "no GPU here: timing the candidates needs one" in out.output
    written = runner.invoke(_tune_app(), ["tune", "--gpu", "a100", "--dtype", "bf16", "--head-dim", "128", "--write"])
    assert isinstance(written.exception, UsageError) and "--write needs a GPU" in str(written.exception)
    bad = runner.invoke(_tune_app(), ["tune", "--gpu", "a100", "--dtype", "bf16", "--head-dim", "128",
                                      "--shapes", "B=1,H=16,N=512,D=64"])
    assert isinstance(bad.exception, UsageError) and "differs from --head-dim" in str(bad.exception)


def test_expert_proposes_the_next_untried_candidate_after_slow_feedback():
    from flashgen.agent.environment import Environment
    from flashgen.agent.expert import ExpertProvider
    from flashgen.agent.providers import ChatMessage, ModelRequest, Task

    env = Environment()
    expert = ExpertProvider(env)
    target = env.target("a100")
    task = Task(variant=CAUSAL, target="a100", arch="sm_80", dtype=DType.bf16, head_dim=128)
    candidates = env.choose_params(CAUSAL, target, DType.bf16, 128)
    assert candidates[0] == choose_params(CAUSAL, "a100", DType.bf16, 128) and len(candidates) > 3
    assert len({tuple(sorted(c.items())) for c in candidates}) == len(candidates)
    slow = ChatMessage(role="user", content="The kernel is correct but slower than the goal.")
    opening = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="write the program")]

    def propose(messages, stage="params"):
        reply = expert.complete(ModelRequest(stage=stage, messages=messages, task=task, phase="params"))
        return dict(env.parse(reply.text.split("```tl\n")[1].split("```")[0]).params)

    first = propose(opening)
    assert first == candidates[0]
    tried = opening + [ChatMessage(role="assistant", content=f"```tl\n{env.library_tl(CAUSAL, target, DType.bf16, 128, 'full', params=first)}```"), slow]
    second = propose(tried, "repair_slow")
    assert second == candidates[1]
    # the conversation keeps only the last exchanges: the expert still moves on from the last one it wrote
    later = opening + [ChatMessage(role="assistant", content=f"```tl\n{env.library_tl(CAUSAL, target, DType.bf16, 128, 'full', params=candidates[2])}```"), slow]
    assert propose(later, "repair_slow") == candidates[3]
    # none left: it repeats the last, and the loop stops on "no faster program proposed"
    last = opening + [ChatMessage(role="assistant", content=f"```tl\n{env.library_tl(CAUSAL, target, DType.bf16, 128, 'full', params=candidates[-1])}```"), slow]
    assert propose(last, "repair_slow") == candidates[-1]
    assert json.dumps(candidates)  # plain ints, as the tuned file and the TL Params line need


def test_compact_parameter_labels_round_trip():
    from flashgen.translators.search import kernel_name, parse_compact_params

    params = parse_compact_params("128x64w4q0s2g0")
    assert params == {"BLOCK_M": 128, "BLOCK_N": 64, "WARPS": 4, "STAGES": 2, "Q_IN_REGS": 0, "GROUP_HEADS": 0}
    assert "GROUP_HEADS" not in parse_compact_params("64x32w4q1s1")
    assert kernel_name(CAUSAL, DType.bf16, 128, "sm_90", params).endswith("_m128n64w4s2q0g0")
    with pytest.raises(UsageError, match="BMxBNwWqQsS"):
        parse_compact_params("128x64 w4")


def test_prepare_candidates_keeps_an_included_choice_past_the_candidate_budget():
    """The search's CPU half (the library job runs it alone, then times on a GPU): the likeliest max_candidates, and
    an `include` (the entry's packaged or default choice) even when the model ranks it lower."""
    from flashgen.harness.tune import prepare_candidates

    live = [r for r in screen_candidates(CAUSAL, "a100", DType.bf16, 128) if r.alive]
    wanted = live[-1].params
    records = prepare_candidates(CAUSAL, "a100", DType.bf16, 128, max_candidates=2, include=[wanted], compile=False)
    kept = [r for r in records if r.alive]
    assert [r.label for r in kept] == [live[0].label, live[1].label, live[-1].label]
    assert all(r.source and r.manifest for r in kept)
    assert sum(r.dropped == "budget: beyond max_candidates" for r in records) == len(live) - 3


def test_with_score_or_mask_functions_the_expert_skips_candidates_the_translator_refuses(monkeypatch):
    # The search screens its space on the variant's own program; a candidate that the translator refuses once the
    # user's functions are written in (more shared memory, say) is passed over, not proposed and then failed.
    from flashgen.agent.environment import Environment
    from flashgen.agent.expert import ExpertProvider
    from flashgen.agent.providers import ChatMessage, ModelRequest, Task
    from flashgen.mods import Mods

    env = Environment()
    target = env.target("h200")
    mods = Mods(score_mod="s + 0.25 * cos(k_idx)")
    task = Task(variant=Variant(), target="h200", arch="sm_90", dtype=DType.bf16, head_dim=128, mods=mods)
    candidates = env.choose_params(Variant(), target, DType.bf16, 128)
    refused = candidates[0]
    real = env.translation_problem

    def problem(tl_text, tgt):
        if dict(env.parse(tl_text).params) == refused:
            return "tiles need 232560 bytes of shared memory"
        return real(tl_text, tgt)

    monkeypatch.setattr(env, "translation_problem", problem)
    opening = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="write the program")]
    reply = ExpertProvider(env).complete(ModelRequest(stage="params", messages=opening, task=task, phase="params"))
    program = env.parse(reply.text.split("```tl\n")[1].split("```")[0])
    assert dict(program.params) == candidates[1] and "cos(k_idx)" in reply.text
    # the translator's own answer for a candidate it cannot take, in one line
    too_big = env.library_tl(Variant(), target, DType.bf16, 256, form="full",
                             params={"BLOCK_M": 192, "BLOCK_N": 176, "WARPS": 12, "STAGES": 3})
    assert "tiles need" in real(too_big, target) and real(reply.text.split("```tl\n")[1].split("```")[0], target) is None


def test_the_search_gives_a_candidate_its_own_range_where_it_beats_the_winner_at_an_end(tmp_path):
    from flashgen.translators.params import choose_size_params

    shapes = [Shape(B=4, H=16, N=1024, M=1024, D=128), Shape(B=1, H=16, N=4096, M=4096, D=128),
              Shape(B=1, H=16, N=16384, M=16384, D=128)]
    a, b, c = _first_labels(3)
    # a wins the geomean (2.0 x 4.0 x 8.0); b is 10 % faster at N = 1024 only, c 2 % faster at 16k (under the 3 %)
    timer = FakeTimer({a: [2.0, 4.0, 8.0], b: [1.8, 5.0, 12.0], c: [2.5, 4.5, 7.85]})
    result = search(CAUSAL, "a100", DType.bf16, 128, shapes, timer=timer, budget_s=60, compile=False,
                    verifier=fake_verifier(set()), max_candidates=3)
    by_label = {r.label: r for r in result.candidates}
    assert result.winner_label == a
    assert [(line.condition, line.params) for line in result.winner_by_size] == [
        ("N <= 1024", {k: v for k, v in by_label[b].params.items() if by_label[a].params.get(k) != v})]
    # c 5 % faster at 16k: a range at the long end too
    timer = FakeTimer({a: [2.0, 4.0, 8.0], b: [1.8, 5.0, 12.0], c: [2.5, 4.5, 7.6]})
    result = search(CAUSAL, "a100", DType.bf16, 128, shapes, timer=timer, budget_s=60, compile=False,
                    verifier=fake_verifier(set()), max_candidates=3)
    assert [line.condition for line in result.winner_by_size] == ["N <= 1024", "N > 4096"]
    # stored with the winner, and read back as the tuned choice's `Params when` lines
    record_winner(result, tmp_path)
    assert [line.condition for line in load_tuned("a100", tmp_path).entries["bf16/causal/d128"].by_size] == [
        "N <= 1024", "N > 4096"]
    choice = choose_params_with_source(CAUSAL, "a100", DType.bf16, 128, tuned_dir=tmp_path)
    assert choice.source == "tuned" and [line.condition for line in choice.by_size] == ["N <= 1024", "N > 4096"]
    assert choose_size_params(CAUSAL, "a100", DType.bf16, 128) == []  # the packaged choice has none on the A100
