"""docs/agent.md shows one rendered prompt per step, rendered here by the loop itself (the real layers for the
openings, the test fakes' feedback for the repairs), so the document cannot drift from the templates: this test
fails when it is stale, and `python tests/test_agent_docs.py --write` rewrites the block between the markers.

Long verbatim parts are shortened the same way every time (the language reference and code blocks of more than
CODE_LINES lines to one line each), so the block stays readable and follows the templates and the rules only."""

import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_prompts import opening_prompts, repair_prompts

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "agent.md"
BEGIN, END = "<!-- prompts:begin -->", "<!-- prompts:end -->"
ARCH, DTYPE = "sm_75", "bf16"  # the T4 in bf16: the target with the most rules (the second trial)
CODE_LINES = 16
STEPS = [  # (template, which rendering, heading)
    ("sketch", 0, "sketch (stage 1a): asks for a ```tl sketch"),
    ("params", 0, "params (stage 1b): asks for the full ```tl program"),
    ("translate", 0, "translate (stage 2): asks for a ```cuda source and a ```json manifest"),
    ("repair_syntax", 0, "repair_syntax: the TL does not parse"),
    ("repair_no_code", 0, "repair_no_code: a reply without the code asked for"),
    ("repair_check", 0, "repair_check: the checker rejects the TL"),
    ("repair_interpret", 0, "repair_interpret: the TL computes something else on the CPU"),
    ("repair_compile", 0, "repair_compile: the CUDA does not build"),
    ("repeated", 0, "repeated: the reply repeated the previous one"),
    ("repair_compile", 1, "repair_compile: the manifest is invalid"),
    ("repair_wrong", 0, "repair_wrong: the kernel's output is wrong on the GPU"),
    ("repair_slow", 0, "repair_slow: correct, slower than the goal"),
]


def _shorten(text: str) -> str:
    """The prompt as the document shows it: the language reference and every code block of more than CODE_LINES
    lines stand as one line each, without sizes, so that the document follows the templates and the rules, not
    the reference's, the library's or the translator's own edits."""
    text = re.sub(r"(## The language: LLM-TL \(the reference\)\n).*?(?=\n## (?:Stage|The target's hardware))",
                  r"\1[the LLM-TL reference: docs/llm-tl.md with the sections this task needs, internal names "
                  r"removed]\n", text, flags=re.DOTALL)

    def code(m: re.Match) -> str:
        if m.group(2).count("\n") < CODE_LINES:
            return m.group(0)
        return f"{m.group(1)}[... {m.group(1)[3:-1] or 'code'}, shortened here ...]{m.group(3)}"

    return re.sub(r"(^```\w*\n)(.*?)(\n```$)", code, text, flags=re.DOTALL | re.MULTILINE)


def rendered_block() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("FLASHGEN_HOME")
        os.environ["FLASHGEN_HOME"] = str(Path(tmp) / "home")  # no user's tuned file
        try:
            prompts = {name: [text] for name, text in opening_prompts(ARCH, DTYPE).items()}
            prompts.update(repair_prompts(ARCH, DTYPE, Path(tmp) / "store"))
        finally:
            if old is None:
                os.environ.pop("FLASHGEN_HOME")
            else:
                os.environ["FLASHGEN_HOME"] = old
    out = [BEGIN, "<!-- written by `python tests/test_agent_docs.py --write`; tests/test_agent_docs.py fails when it "
                  "is stale -->", "",
           "Rendered for the T4 (sm_75), bf16, head dim 64, causal with softcap 30; the repairs carry the feedback of "
           "the test fakes (tests/loopback/fakes.py). The reference and code blocks of more than 16 lines are "
           "shortened here, never in the prompt.", ""]
    for name, index, heading in STEPS:
        text = prompts[name][index]
        out += [f"#### {heading}", "", "````text", _shorten(text).rstrip("\n"), "````", ""]
    return "\n".join(out) + END


def _current() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN):text.index(END) + len(END)]


def test_the_rendered_prompts_in_docs_agent_md_are_current():
    assert _current() == rendered_block(), "docs/agent.md is stale: run `python tests/test_agent_docs.py --write`"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_agent_docs.py --write")
    text = DOC.read_text()
    DOC.write_text(text[:text.index(BEGIN)] + rendered_block() + text[text.index(END) + len(END):])
    print(f"wrote {DOC}")
