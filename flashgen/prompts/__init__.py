"""The prompt templates (jinja2, StrictUndefined: a missing value is an error, never an empty hole). Which of the
target's rules each step gets: `rules.py`; the package's names, which no prompt may hold: `internal.py`; what each
step sends and expects, with one rendered prompt per step: docs/agent.md."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

PROMPT_DIR = Path(__file__).parent


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(PROMPT_DIR)), undefined=jinja2.StrictUndefined,
                              autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render(name: str, **context) -> str:
    """Render `flashgen/prompts/NAME.j2` with `context`."""
    return _environment().get_template(f"{name}.j2").render(**context).strip() + "\n"


def names() -> list[str]:
    return sorted(p.stem for p in PROMPT_DIR.glob("*.j2"))
