"""Translators: full LLM-TL -> CUDA source + KernelManifest.

translate(program, target, *, name=None, fast_math=False) -> Translation(source, manifest, plan, notes)
manifest_for(program, target, *, name=None) -> KernelManifest   (the launches a CUDA translation must serve)
lower(program, target, *, name=None, fast_math=False) -> (KernelPlan, notes)
UnsupportedConstruct(FlashgenError): one line naming the TL construct and its line.
plan_for_variant(variant, target, dtype, head_dim) -> KernelPlan   (the rule-based plan, without TL)

`target` is a flashgen.targets.Target (or a GPU name, or an arch: the first known GPU of it); its code path is a
backend (flashgen.translators.backends), chosen once by backend_for(target) and named in the KernelPlan.
"""

from flashgen.translators.cexpr import UnsupportedConstruct
from flashgen.translators.lower import Translation, lower, manifest_for, translate
from flashgen.translators.rules import plan_for_variant

__all__ = ["Translation", "UnsupportedConstruct", "lower", "manifest_for", "plan_for_variant", "translate"]
