"""The Python API: `flashgen.generate(...) -> Kernel`.

    import flashgen
    kernel = flashgen.generate(gpu="h200", dtype="bf16", head_dim=128, causal=True)
    print(kernel.tl); print(kernel.report)
    o = kernel(q, k, v)            # torch CUDA tensors (B, H, N, D) / (B, KVH, M, D), zero-copy (GPU only)
    o, lse = flashgen.generate(..., lse=True)(q, k, v)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flashgen.abi import KernelManifest
from pydantic import ValidationError

from flashgen.errors import FlashgenError, UsageError, pydantic_message
from flashgen.variant import DType, Variant, make_variant, parse_dtype

__all__ = ["DEFAULT_DTYPE", "DEFAULT_GPU", "DEFAULT_HEAD_DIM", "Kernel", "default_out_dir", "generate", "make_variant",
           "parse_dtype"]

DEFAULT_GPU = "h200"
DEFAULT_DTYPE = "fp16"
DEFAULT_HEAD_DIM = 128


class Kernel:
    """A generated kernel: its TL (sketch and full), CUDA source, manifest, report and meta, callable
    on torch CUDA tensors when a GPU is present."""

    def __init__(self, *, tl: str, sketch: str, source: str, manifest: KernelManifest, report: str,
                 meta: dict[str, Any], out_dir: Path | None = None, run_id: str | None = None):
        self.tl, self.sketch, self.source, self.manifest = tl, sketch, source, manifest
        self.report, self.meta, self.out_dir, self.run_id = report, meta, out_dir, run_id
        self._launcher = None

    @property
    def verified(self) -> bool | None:
        return self.meta.get("verification", {}).get("ok")

    def __call__(self, q, k, v, scale: float | None = None):
        """O (and LSE when the variant returns it) for torch CUDA tensors q (B, H, N, D), k and v
        (B, KVH, M, D), through the harness's launcher (zero-copy, on the tensors' current stream)."""
        from flashgen.harness.device import device_arch, launch

        if self._launcher is None:
            from flashgen.harness.compile import compile_cuda

            # compiled for the GPU the tensors live on (the kernel's target arch may be older)
            built = compile_cuda(self.source, device_arch())
            if not built.ok:
                raise FlashgenError(f"{self.manifest.name} does not build for {device_arch()}: "
                                    f"{built.feedback_text(300).splitlines()[0]}")
            self._launcher = built.cubin_path
        import torch

        o = torch.empty_like(q)
        lse = None
        if self.manifest.variant.return_lse:
            lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        launch(self.manifest, self._launcher, q, k, v, o, lse, scale=scale)
        return (o, lse) if lse is not None else o

    def __repr__(self) -> str:
        m = self.manifest
        return f"Kernel({m.name}, {m.arch}, {m.dtype.value}, d={m.head_dim}, verified={self.verified})"


def check_out_dir(out: str | Path, name: str = "out") -> None:
    """Refuse an output folder that cannot be written (an existing file, a read-only folder) before any work,
    as one line naming `name` (the CLI passes '--out'); it is created only when the kernel is written."""
    import os
    import tempfile

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{name} {out}: is an existing file, expected a folder (new or existing)")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{name} {out}: {probe} is a file, so the folder cannot be created")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".flashgen-probe-", dir=probe))
    except OSError as exc:
        raise UsageError(f"{name} {out}: folder not writable ({probe}: {exc.strerror or exc})") from None


def default_out_dir(target_name: str, dtype: DType, variant: Variant, head_dim: int) -> Path:
    return Path("generated") / target_name / dtype.value / f"{variant.name}_d{head_dim}"


def generate(gpu: str = DEFAULT_GPU, dtype: str = DEFAULT_DTYPE, head_dim: int = DEFAULT_HEAD_DIM, *,
             causal: bool = False, window: int | None = None, alibi: bool = False, softcap: float | None = None,
             kv_group: int = 1, norm: str = "softmax", lse: bool = False, provider: str = "expert",
             model: str | None = None, base_url: str | None = None, max_iters: int = 12,
             max_tokens: int | None = None, max_cost_usd: float | None = None, max_wall_s: float | None = None,
             goal_speedup: float = 1.0, out: str | Path | None = None, resume: str | None = None,
             store=None, env=None, progress=None) -> Kernel:
    """Generate (or, with `resume`, finish generating) a kernel; writes its files to `out` when given.

    Raises FlashgenError subclasses (one line) for bad input and for a run that ends without a
    kernel."""
    from flashgen.harness.environment import Environment
    from flashgen.agent.loop import Budget, LoopConfig, resume_loop, run_loop
    from flashgen.agent.outputs import write_outputs
    from flashgen.agent.providers import Task, make_provider

    env = env or Environment()
    progress = progress or (lambda _msg: None)

    def provider_from(info: dict[str, Any]):
        if info.get("name") == "expert":
            from flashgen.agent.expert import ExpertProvider

            return ExpertProvider(env)
        return make_provider(info["name"], info.get("model"), info.get("base_url"))

    if resume is not None:
        result = resume_loop(resume, provider_from, env=env, store=store, progress=progress)
    else:
        target = env.target(gpu)
        dtype_value = parse_dtype(dtype)
        if head_dim < 1:
            raise UsageError(f"head dim must be positive, got {head_dim}")
        variant = make_variant(causal=causal, window=window, alibi=alibi, softcap=softcap, norm=norm, lse=lse,
                               kv_group=kv_group)
        env.check_supported(variant, target, dtype_value, head_dim)
        if out is not None:
            check_out_dir(out)
        task = Task(variant=variant, target=target.name, arch=target.arch, dtype=dtype_value, head_dim=head_dim)
        try:
            config = LoopConfig(task=task, goal_speedup=goal_speedup,
                                budget=Budget(max_iters=max_iters, max_tokens=max_tokens, max_cost_usd=max_cost_usd,
                                              max_wall_s=max_wall_s))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise UsageError(f"{first['loc'][-1]}={first.get('input')!r}: {pydantic_message(first)}") from None
        info = {"name": provider, "model": model, "base_url": base_url}
        result = run_loop(config, provider_from(info), env=env, store=store, provider_info=info, progress=progress)
    task = result.task
    target = env.target(task.target)
    out_dir = Path(out) if out is not None else None
    files = write_outputs(result, task, target, env, out_dir)
    if result.best is None:
        where = f"; partial files in {out_dir}" if out_dir is not None else ""
        raise FlashgenError(f"no kernel: {result.reason} (run {result.run_id}; --resume {result.run_id} "
                            f"continues it){where}")
    return Kernel(tl=result.best.tl, sketch=result.best.sketch, source=result.best.cuda, manifest=result.best.manifest,
                  report=files.report, meta=files.meta, out_dir=out_dir, run_id=result.run_id)
