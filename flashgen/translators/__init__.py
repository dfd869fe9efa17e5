"""Translators: full LLM-TL -> CUDA source + KernelManifest.

translate(program, target, *, name=None, fast_math=False) -> Translation(source, manifest, plan, notes)
manifest_for(program, target, *, name=None) -> KernelManifest   (the launches a CUDA translation must serve)
lower(program, target, *, name=None, fast_math=False) -> (KernelPlan, notes)
UnsupportedConstruct(FlashgenError): one line naming the TL construct and its line.
"""

from flashgen.translators.cexpr import UnsupportedConstruct
from flashgen.translators.lower import Translation, lower, manifest_for, translate

__all__ = ["Translation", "UnsupportedConstruct", "lower", "manifest_for", "translate"]
