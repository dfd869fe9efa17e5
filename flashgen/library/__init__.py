"""Kernel libraries: many kernels built in one job, across the cores and GPUs of a machine or a Ray cluster
(docs/batch.md).

    summary = flashgen.library.build("lib.toml", out="lib/")          # the spec: a TOML file or a Spec
    kernel = flashgen.library.load("lib/").pick(gpu="h200", dtype="bf16", variant="causal", head_dim=128)
    rows = flashgen.library.diff("old/", "lib/")
"""

from __future__ import annotations

from flashgen.library.index import Library, diff, load
from flashgen.library.job import JobSummary, build, plan
from flashgen.library.spec import Spec, load_spec, parse_spec, parse_variant_name

__all__ = ["JobSummary", "Library", "Spec", "build", "diff", "load", "load_spec", "parse_spec", "parse_variant_name",
           "plan"]
