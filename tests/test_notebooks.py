"""The example notebooks run headless (nbclient) from a clean state and show what each is for; a cell that raises,
or a notebook past its limit, fails the test. On the CPU they run from committed results and say so first; on a GPU
the same notebooks run live (examples/run_notebooks.py, the command in examples/README.md)."""

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
_spec = importlib.util.spec_from_file_location("run_notebooks", EXAMPLES / "run_notebooks.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

LIMIT_S = 240.0  # each notebook, on a loaded 2-core machine (about 15 s when the machine is idle)
#: what each notebook's outputs must show, beyond running
SHOWS = {
    "01_generate_a_kernel.ipynb": ("Sketch TL", "Full TL", "CUDA (", "registers", "run 1: generate", 'id="roof-h200"',
                                   "TL difference", "<td>t4</td>"),
    "02_score_function.ipynb": ("matches (max |diff|", "the TL is the kernel&#x27;s reference", "DIFFERS"),
    "03_read_a_benchmark.ipynb": ('id="series-flashgen-0"', 'id="series-CUDNN-11"', "x CUDNN", "sm_80 code path"),
    "04_parameter_search.ipynb": ('id="heat-model"', "Tile search", "GPU targets"),
}


def test_every_notebook_is_listed_and_committed_clean():
    names = [p.name for p in runner.notebooks()]
    assert names == sorted(SHOWS)
    for path in runner.notebooks():
        book = json.loads(path.read_text())
        code = [c for c in book["cells"] if c["cell_type"] == "code"]
        assert all(not c["outputs"] and c["execution_count"] is None for c in code), f"{path.name} has outputs"
        assert "explore.gpu_note()" in "".join(code[0]["source"])  # the first cell says what the machine runs


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHOWS))
def test_notebook_runs_headless_and_shows_what_it_is_for(name, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_HOME", str(tmp_path / "home"))  # a record of its own: the trace is run 1
    book, seconds, error = runner.execute(EXAMPLES / name, tmp_path / "out", limit_s=LIMIT_S)
    assert error is None, error
    assert seconds < LIMIT_S
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = "\n".join(str(o.get("data", {}).get("text/html", "")) + str(o.get("data", {}).get("text/plain", ""))
                      + str(o.get("text", "")) for o in outputs)
    first = book.cells[[c.cell_type for c in book.cells].index("code")]
    assert any(word in str(first.outputs) for word in ("No GPU here", "GPU here:"))
    for text in SHOWS[name]:
        assert text in shown, f"{name} does not show {text!r}"
    assert (tmp_path / "out" / name).is_file()
