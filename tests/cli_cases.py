"""Many `flashgen generate` command lines in one process (flashgen.cli.main, as the console script runs it), each
one's stderr and exit code apart: for tests of bad options that must end in one line and exit 2 before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_RUNNER = ("import json, sys\nfrom flashgen.cli import main\n"
           "for args in json.loads(sys.argv[1]):\n"
           "    sys.stderr.write('@@case\\n'); sys.stderr.flush()\n"
           "    try:\n"
           "        main(['generate', '--gpu', 'a100', '--out', 'o', *args]); rc = 0\n"
           "    except SystemExit as exc:\n"
           "        rc = exc.code\n"
           "    sys.stderr.flush(); sys.stderr.write(f'@@rc {rc}\\n'); sys.stderr.flush()\n")


def assert_one_line_exit_2(cases: list[tuple[list[str], str]], tmp_path: Path) -> None:
    """`flashgen generate --gpu a100 --out o ARGS` for each (ARGS, the start of its one line): exit 2, that one line on
    stderr, no traceback, no output folder and no run recorded (FLASHGEN_HOME stays unmade)."""
    env = {**os.environ, "FLASHGEN_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps([args for args, _ in cases])],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    outputs = done.stderr.split("@@case\n")[1:]
    assert len(outputs) == len(cases)
    for (args, want), output in zip(cases, outputs, strict=True):
        text, _, rc = output.rpartition("@@rc ")
        lines = [line for line in text.splitlines() if line.strip()]
        assert rc.strip() == "2" and len(lines) == 1 and lines[0].startswith(want), (args, rc, text)
    assert not (tmp_path / "o").exists() and not (tmp_path / "home").exists()
