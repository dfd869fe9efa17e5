"""flashgen.harness.sanitize's reading of compute-sanitizer's output (the runs themselves are GPU tests:
tests/test_sanitizer_gpu.py)."""

from __future__ import annotations

from flashgen.harness.sanitize import _report


def test_the_parser_reads_a_failing_summary():
    """The report is not ok when the tool reports a hazard, an error, or a kernel that wrote nothing."""
    race = _report("racecheck", "launched a written 4 of 4\n========= RACECHECK SUMMARY: 2 hazards displayed "
                   "(2 errors, 0 warnings)\n", 1, {"a"})
    assert (race.ok, race.hazards, race.errors) == (False, 2, 2)
    short = _report("synccheck", "launched a written 3 of 4\n========= ERROR SUMMARY: 0 errors\n", 0, {"a"})
    assert not short.ok
    clean = _report("synccheck", "launched a written 4 of 4\n========= ERROR SUMMARY: 0 errors\n", 0, {"a"})
    assert clean.ok
