"""README's performance sentence is what benchmarks/readme_figures.py computes from the committed results."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "benchmarks" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_figures_come_from_the_newest_committed_result():
    figures = _script()
    want = figures.readme_text()
    assert figures.block((ROOT / "README.md").read_text()) == want, (
        "README.md's performance sentence is stale: run python benchmarks/readme_figures.py --write")


def test_figures_are_computed_from_the_result(tmp_path):
    figures = _script()
    rows = [{"speedup": {"sdpa_flash": x, "sdpa_cudnn": 0.5, "flex": 1.0}} for x in (0.9, 1.0, 1.2)]
    for name, created, flash in (("a-fa2-sm_80-old.json", "2026-01-01T00:00:00+00:00", 0.5),
                                 ("b-fa2-sm_80-new.json", "2026-02-01T00:00:00+00:00", 1.0),
                                 ("c-fa2-sm_75-newer.json", "2026-03-01T00:00:00+00:00", 0.4)):
        (tmp_path / name).write_text(json.dumps({
            "gpu": "h200", "created": created, "env": {"gpu": "NVIDIA H200"}, "rows": rows,
            "summary": {"geomean_speedup": {"sdpa_flash": flash, "sdpa_cudnn": 0.5, "flex": 1.25}}}))
    newest = figures.newest_result(tmp_path)
    assert newest.name == "b-fa2-sm_80-new.json"
    text = " ".join(figures.figures(newest).split())
    assert "1.00x FlashAttention-2" in text and "0.90x to 1.20x" in text and "3 shapes" in text
    assert "1.25x FlexAttention" in text and "cuDNN is faster still (ours at 0.50x)" in text
    readme = f"intro\n{figures.BEGIN}\nold\n{figures.END}\nrest\n"
    assert figures.block(figures.with_block(readme, "new")) == "new"
    assert figures.with_block(readme, "new").endswith(f"{figures.END}\nrest\n")
    with pytest.raises(SystemExit):
        figures.block("no markers")
