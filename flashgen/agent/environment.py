"""The agent's door to the layers below: `Environment` and its outcome models, defined in
flashgen.harness.environment (the harness's suite builds kernels through it too) and handed on here under
their agent names."""

from flashgen.harness.environment import (
    ROOFLINE_SHAPE,
    Build,
    CpuCheck,
    Environment,
    LayerMissing,
    Timing,
    Verification,
    _timing_from,
    interpret_shapes,
    manifest_from_json,
)

__all__ = ["ROOFLINE_SHAPE", "Build", "CpuCheck", "Environment", "LayerMissing", "Timing", "Verification",
           "_timing_from", "interpret_shapes", "manifest_from_json"]
