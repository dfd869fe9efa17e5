"""The Python API: `flashgen.generate(...) -> Kernel`.

    import flashgen
    kernel = flashgen.generate(gpu="h200", dtype="bf16", head_dim=128, causal=True)
    print(kernel.tl); print(kernel.report)
    o = kernel(q, k, v)            # CUDA arrays (B, H, N, D) / (B, KVH, M, D): torch, cupy, pycuda, jax (GPU only)
    o, lse = flashgen.generate(..., lse=True)(q, k, v)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flashgen.abi import KernelManifest
from flashgen.errors import FlashgenError, UsageError, pydantic_message
from flashgen.variant import DType, Variant, check_head_dim, check_head_dim_v, head_dims_tag, make_variant, parse_dtype

__all__ = ["DEFAULT_DTYPE", "DEFAULT_GPU", "DEFAULT_HEAD_DIM", "Kernel", "ProgramRejected", "build", "default_build_dir",
           "default_out_dir", "generate", "make_variant", "parse_dtype"]

DEFAULT_GPU = "h200"
DEFAULT_DTYPE = "fp16"
DEFAULT_HEAD_DIM = 128


class Kernel:
    """A generated kernel: its TL (sketch and full), CUDA source, manifest, report and meta, callable
    on CUDA arrays (torch, cupy, pycuda, jax: __cuda_array_interface__ or DLPack) when a GPU is present.
    `summary` (from `generate`): the run's end as data, a flashgen.agent.summary.GenerateSummary."""

    def __init__(self, *, tl: str, sketch: str, source: str, manifest: KernelManifest, report: str,
                 meta: dict[str, Any], out_dir: Path | None = None, run_id: str | None = None, summary=None):
        self.tl, self.sketch, self.source, self.manifest = tl, sketch, source, manifest
        self.report, self.meta, self.out_dir, self.run_id = report, meta, out_dir, run_id
        self.summary = summary
        # the softmax scale it was generated (checked, verified, timed) with, when given: a call's default
        self.softmax_scale: float | None = meta.get("softmax_scale")
        self._launcher = None

    @property
    def verified(self) -> bool | None:
        return self.meta.get("verification", {}).get("ok")

    def __call__(self, q, k, v, scale: float | None = None, alibi_slopes=None, tensors=None):
        """O (and LSE when the variant returns it) for CUDA arrays q (B, H, N, D), k (B, KVH, M, D) and v
        (B, KVH, M, Dv) in the kernel's dtype (Dv: the kernel's V head dim, `manifest.dv`; D unless generated with
        head_dim_v; O is (B, H, N, Dv)), zero-copy, on the arrays' current stream: torch tensors, anything with
        __cuda_array_interface__ (cupy, pycuda GPUArray, numba, jax) or DLPack; all of one kind. O and LSE come
        back as that kind (torch, cupy, pycuda, numba; a cupy array for jax and other kinds). Running needs cupy (the
        gpu extra); torch is optional. A bad array is an ArrayError (a ValueError), one line. `scale`: the softmax
        scale (None: the one `generate` was given, else 1/sqrt(D)). `alibi_slopes` (an ALiBi kernel): FlashAttention's
        fp32 (H) or (B, H) slopes (None: the standard 2^(-8 (h + 1) / H)). `tensors`: {name: array} for each call-time
        tensor of the kernel's score and mask functions (`kernel.manifest.mod_tensors`: int32 or fp32 of the declared
        shape), every one it declares."""
        from flashgen.harness.device import (
            ArrayError,
            _check_tensor,
            call_time_views,
            check_call_time,
            check_same_kind,
            check_v_head_dim,
            device_arch,
            empty_like,
            launch,
            tensor_view,
        )

        views = {name: tensor_view(x, name) for name, x in (("q", q), ("k", k), ("v", v))}
        slopes, named = call_time_views(alibi_slopes, tensors)
        check_same_kind({**views, **({"alibi_slopes": slopes} if slopes is not None else {}),
                         **{f"tensors[{n!r}]": view for n, view in named.items()}})
        if any(len(view.shape) != 4 for view in views.values()):
            raise ArrayError("q, k, v must be 4-D: q (B, H, N, D), k and v (B, KVH, M, D); got "
                             + ", ".join(f"{n} {tuple(view.shape)}" for n, view in views.items()))
        for name, view in views.items():
            _check_tensor(name, view, self.manifest.dtype.value)
        check_v_head_dim(self.manifest, views["v"])  # before compiling: one line now
        check_call_time(self.manifest, views["q"], views["k"], slopes, named)
        if self._launcher is None:
            from flashgen.harness.compile import compile_cuda

            # compiled for the GPU the arrays live on (the kernel's target arch may be older)
            built = compile_cuda(self.source, device_arch())
            if not built.ok:
                raise FlashgenError(f"{self.manifest.name} does not build for {device_arch()}: "
                                    f"{built.feedback_text(300).splitlines()[0]}")
            self._launcher = built.cubin_path
        b, h, n, _ = views["q"].shape
        o = empty_like(q, (b, h, n, self.manifest.dv), self.manifest.dtype.value)
        lse = empty_like(q, (b, h, n), "fp32") if self.manifest.variant.return_lse else None
        launch(self.manifest, self._launcher, q, k, v, o, lse, scale=self.softmax_scale if scale is None else scale,
               alibi_slopes=alibi_slopes, tensors=tensors)
        return (o, lse) if lse is not None else o

    def __repr__(self) -> str:
        m = self.manifest
        dv = f", dv={m.head_dim_v}" if m.head_dim_v is not None else ""
        return f"Kernel({m.name}, {m.arch}, {m.dtype.value}, d={m.head_dim}{dv}, verified={self.verified})"

    def _repr_html_(self) -> str:  # Jupyter: TL and CUDA side by side, verification, resources, timings
        from flashgen.explore import kernel_html

        return kernel_html(self)


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


def default_out_dir(target_name: str, dtype: DType, variant: Variant, head_dim: int, mods=None,
                    head_dim_v: int | None = None) -> Path:
    """generated/GPU/DTYPE/VARIANT_dD; with score or mask functions (flashgen.mods) VARIANT_modHASH_dD; with a V head
    dim of its own VARIANT_dDvDV (d192v128)."""
    tag = f"_{mods.tag}" if mods is not None else ""
    return Path("generated") / target_name / dtype.value / f"{variant.name}{tag}_{head_dims_tag(head_dim, head_dim_v)}"


def generate(gpu: str = DEFAULT_GPU, dtype: str = DEFAULT_DTYPE, head_dim: int = DEFAULT_HEAD_DIM, *,
             causal: bool = False, window: int | None = None, alibi: bool = False, softcap: float | None = None,
             kv_group: int = 1, norm: str = "softmax", lse: bool = False, provider: str | None = None,
             model: str | None = None, base_url: str | None = None, max_iters: int | None = None,
             max_tokens: int | None = None, max_cost_usd: float | None = None, max_wall_s: float | None = None,
             goal_speedup: float = 1.0, out: str | Path | None = None, resume: str | None = None,
             request_timeout_s: float | None = None, retries: int | None = None,
             score_mod: str | None = None, mask_mod: str | None = None, params: dict[str, Any] | None = None,
             tensors: dict[str, str] | None = None,
             store=None, env=None, progress=None, window_size: tuple[int, int] | None = None,
             softmax_scale: float | None = None, split_kv: bool = False, num_splits: int | None = None,
             head_dim_v: int | None = None) -> Kernel:
    """Generate (or, with `resume`, finish generating) a kernel; writes its files to `out` when given (atomically,
    holding a lock on the folder for the whole run: a second writer is refused).

    Budgets left as None take the defaults (12 model calls, no other limit); on `resume` the ones given replace the
    run's recorded budget. A new run's `max_iters` below the calls a kernel needs (loop.MIN_MODEL_CALLS) is refused
    before any model call. `provider` (default expert), `model` and `base_url`: on `resume`, given ones replace the
    provider the run last used (recorded with the resume). `request_timeout_s` and `retries` shape a model
    provider's HTTP calls (RetryPolicy).
    FlashAttention's interface: `window_size=(left, right)`, -1 for an unbounded side (with `causal` the right side is
    0; (W - 1, 0) is window=W; docs/variants.md); `softmax_scale` (default 1/sqrt(D)): the scale the CPU check,
    verification and timing run with, recorded in meta.json and the returned Kernel's default; `split_kv`: split-KV
    decode, `num_splits` its fixed split count (default: chosen by the sizes at each launch). On `resume` the run's
    recorded ones hold: these are refused there. `head_dim_v`: V's and O's own head dim Dv (DeepSeek-style prefill:
    head_dim=192, head_dim_v=128; v (B, KVH, M, Dv), o (B, H, N, Dv)), by the rule of head_dim; None: head_dim.
    Score and mask functions (flashgen.mods, docs/variants.md): `score_mod` an expression over the score s, q_idx,
    k_idx, b, h and the sizes, `mask_mod` a condition over the same, `params` {NAME: number} constants they read,
    `tensors` {NAME: "int32[B]:0..M"} call-time tensors they read as NAME[i] (DTYPE[DIMS][:LO..HI][:sorted]: int32 or
    fp32, dims over B, H, KVH, N, M, D, and the fill verification and timing use; the kernel's call then takes
    tensors={NAME: array}); written into the kernel's TL, which is then its own fp64 reference; a bad one is a
    UsageError before any model call. On `resume` the run's own hold: these are refused there.
    Raises FlashgenError subclasses (one line) for bad input and for a run that ends without a kernel;
    flashgen.errors.Interrupted (a KeyboardInterrupt) when SIGINT stops the run, after recording it."""
    from contextlib import nullcontext

    from flashgen.agent.loop import Budget, LoopConfig, check_makes_a_kernel, resume_loop, run_loop
    from flashgen.agent.outputs import out_lock, write_outputs
    from flashgen.agent.providers import RetryPolicy, Task, make_provider
    from flashgen.agent.summary import summarize
    from flashgen.errors import Interrupted
    from flashgen.harness.environment import Environment

    env = env or Environment()
    progress = progress or (lambda _msg: None)
    calls = {k: v for k, v in (("request_timeout_s", request_timeout_s), ("retries", retries)) if v is not None}
    retry_fields = {"timeout_s": request_timeout_s, "max_attempts": None if retries is None else retries + 1}
    try:
        RetryPolicy(**{k: v for k, v in retry_fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"{first['loc'][-1]}={first.get('input')!r}: {pydantic_message(first)}") from None

    def provider_from(info: dict[str, Any]):
        info = {**info, **calls}  # the call options given now win over the recorded ones
        if info.get("name") == "expert":
            from flashgen.agent.expert import ExpertProvider

            return ExpertProvider(env)
        from flashgen.agent.user import USER, UserProgramProvider

        if info.get("name") == USER:  # a `flashgen build` run: the user's program (recorded), then its model if any
            if "program" not in info:
                raise UsageError(f"run {resume} is a `flashgen build` run recorded without its program (an older "
                                 f"record): build {info.get('file', 'the file')} again, or resume with --provider")
            then = provider_from(info["then"]) if info.get("then") else None
            return UserProgramProvider(info["program"], info.get("file", "<tl>"), env=env, then=then,
                                       custom=bool(info.get("custom")))
        fields = {"timeout_s": info.get("request_timeout_s"),
                  "max_attempts": None if info.get("retries") is None else info["retries"] + 1}
        retry = RetryPolicy(**{k: v for k, v in fields.items() if v is not None})
        return make_provider(info["name"], info.get("model"), info.get("base_url"), retry=retry)

    budget = {k: v for k, v in (("max_iters", max_iters), ("max_tokens", max_tokens), ("max_cost_usd", max_cost_usd),
                                ("max_wall_s", max_wall_s)) if v is not None}
    runtime = {k: v for k, v in (("softmax_scale", softmax_scale), ("num_splits", num_splits)) if v is not None}
    if resume is not None and runtime:
        raise UsageError(f"{', '.join(runtime)}: a resume runs with the run's recorded settings; give them to a new run")
    if resume is not None and head_dim_v is not None:
        raise UsageError("head_dim_v: a resume keeps the run's own head dims; give it to a new run")
    if resume is not None and (score_mod is not None or mask_mod is not None or params or tensors):
        raise UsageError("score_mod, mask_mod, params, tensors: a resume keeps the run's own functions; give them to a "
                         "new run")
    task = config = None
    if resume is None:
        from flashgen.mods import make_mods

        mods = make_mods(score_mod, mask_mod, params, tensors)  # a bad expression: one line, before any work
        target = env.target(gpu)
        dtype_value = parse_dtype(dtype)
        check_head_dim(head_dim)
        head_dim_v = check_head_dim_v(head_dim_v, head_dim, "head_dim_v")  # None where it is head_dim
        dims = {"head_dim_v": head_dim_v} if head_dim_v is not None else {}
        variant = make_variant(causal=causal, window=window, alibi=alibi, softcap=softcap, norm=norm, lse=lse,
                               kv_group=kv_group, window_size=window_size, split_kv=split_kv)
        if num_splits is not None and not variant.split_kv:
            raise UsageError(f"num_splits {num_splits}: only for split-KV decode (split_kv=True, --split-kv)")
        env.check_supported(variant, target, dtype_value, head_dim, **dims)
        if out is not None:
            check_out_dir(out)
        task = Task(variant=variant, target=target.name, arch=target.arch, dtype=dtype_value, head_dim=head_dim,
                    head_dim_v=head_dim_v)
        try:
            config = LoopConfig(task=task, goal_speedup=goal_speedup, budget=Budget(**budget), **runtime)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise UsageError(f"{first['loc'][-1]}={first.get('input')!r}: {pydantic_message(first)}") from None
        check_makes_a_kernel(config.budget.max_iters)
        if mods is not None:  # the functions: the run's reference is the TL they make, interpreted in fp64
            from flashgen.mods import announce, reference_program

            config.task = task = task.model_copy(update={"mods": mods})
            config.reference_tl = reference_program(mods, variant, target, dtype_value, head_dim, env, **dims)
            announce(mods, config.reference_tl, progress)
    elif out is not None:
        check_out_dir(out)
    out_dir = Path(out) if out is not None else None
    where = f"--out {out_dir}" if out_dir is not None else "--out DIR"
    with out_lock(out_dir) if out_dir is not None else nullcontext():
        try:
            if resume is not None:
                switch = {"name": provider, "model": model, "base_url": base_url}
                result = resume_loop(resume, provider_from, env=env, store=store, progress=progress, budget=budget,
                                     provider=switch)
            else:
                info = {"name": provider or "expert", "model": model, "base_url": base_url, **calls}
                result = run_loop(config, provider_from(info), env=env, store=store, provider_info=info,
                                  progress=progress)
        except Interrupted as exc:
            raise Interrupted(str(exc).replace("--out DIR", where), exc.signal_name) from None
        task = result.task
        target = env.target(task.target)
        try:
            files = write_outputs(result, task, target, env, out_dir)
        except OSError as exc:  # the run is recorded; its files can be written again from the record
            raise FlashgenError(f"--out {out_dir}: cannot write ({exc.strerror or exc}); run {result.run_id} is "
                                f"recorded: `flashgen generate --resume {result.run_id} {where}` writes it "
                                "again") from None
    if result.best is None:
        partial = f"; partial files in {out_dir}" if out_dir is not None else ""
        hint = result.resume.get("how", f"--resume {result.run_id} continues it").replace("--out DIR", where)
        raise FlashgenError(f"no kernel: {result.reason} (run {result.run_id}; {hint}){partial}")
    gpu_name = env.gpu_name() if result.best.verification.ran else None
    summary = summarize(result, files.meta, out_dir, files.written, gpu_name)
    return Kernel(tl=result.best.tl, sketch=result.best.sketch, source=result.best.cuda, manifest=result.best.manifest,
                  report=files.report, meta=files.meta, out_dir=out_dir, run_id=result.run_id, summary=summary)


# ------------------------------------------------------------------------------------------ a user's TL: build

class ProgramRejected(FlashgenError):
    """A user's TL program that `build` cannot take as it is: a sketch, another dtype than asked, a checker error
    (FILE:LINE:COL: message, one line)."""

    exit_code = 1


def default_build_dir(target_name: str, dtype: DType, label: str) -> Path:
    """build/GPU/DTYPE/STEM: beside generated/'s layout, in a folder a checkout ignores."""
    stem = Path(label).stem if label and not label.startswith("<") else "kernel"
    return Path("build") / target_name / dtype.value / (stem or "kernel")


def build(tl: str | Path, gpu: str, dtype: str, *, out: str | Path | None = None, provider=None,
          model: str | None = None, base_url: str | None = None, max_iters: int | None = None,
          goal_speedup: float | None = None, name: str | None = None, store=None, env=None,
          progress=None) -> Kernel:
    """Build a user's own full TL program (`tl`: its text, or a path to its file) for `gpu` in `dtype`: parsed and
    checked (a checker error is a ProgramRejected, one line with its line number), interpreted on the CPU against
    its own fp64 meaning (the variant's reference when it computes its Variant line, else its own interpretation,
    which then is the kernel's `reference_tl`), translated, compiled and, where a GPU is present, verified and
    timed: through the generate loop and store (flashgen.agent.user.UserProgramProvider gives the program as the
    loop's first replies), so the run is recorded and `out` gets generate's files.

    `provider` (openai, anthropic, openai-compatible; `model`, `base_url`; or a Provider object): a model that
    repairs or speeds up the program from its feedback (budget `max_iters` steps, the program's own included, and
    `goal_speedup`); without one a failure ends the run, raised as one line (FlashgenError), and the first correct
    kernel is the result. `name`: the program's label in messages (default: the path, or '<tl>'). `out`: where the
    files go (none written without it)."""
    import os
    from contextlib import nullcontext
    from typing import get_args

    from flashgen.agent.loop import Budget, LoopConfig, Phase, run_loop
    from flashgen.agent.outputs import out_lock, write_outputs
    from flashgen.agent.providers import Task, make_provider
    from flashgen.agent.user import USER, UserProgramProvider
    from flashgen.errors import Interrupted, read_text_input
    from flashgen.harness.environment import Environment
    from flashgen.tl_spec import check, parse
    from flashgen.tl_spec.diagnostics import errors_only

    env = env or Environment()
    progress = progress or (lambda _msg: None)
    target = env.target(gpu)
    dtype_value = parse_dtype(dtype)
    if isinstance(tl, os.PathLike):
        label = name or os.fspath(tl)
        text = read_text_input(os.fspath(tl))
    else:
        label = name or "<tl>"
        text = tl
        if not isinstance(text, str) or not text.strip():
            raise UsageError("build: the program is empty (give the TL text, or a Path to its file)")
    if provider == "expert":
        raise UsageError("--provider expert writes the library's programs, not repairs of yours: give openai, "
                         "anthropic or openai-compatible (or no --provider: build the program as it is)")
    if isinstance(provider, str):
        then = make_provider(provider, model, base_url)  # no key, no SDK: one line, before any work
        then_info = {"name": provider, "model": then.model, "base_url": base_url}
    else:  # None, or a Provider object (a Python caller's own)
        then = provider
        then_info = None if then is None else {"name": then.name, "model": then.model}
    program = parse(text, label)  # TLSyntaxError: FILE:LINE:COL: message, one line
    if not program.is_full or program.variant is None:
        raise ProgramRejected(f"{label}:1:1: a sketch: `flashgen build` takes a full program (the Target, Variant and "
                              "Params lines, allocations and indexed copies; docs/llm-tl.md)")
    decl = program.target
    if decl.dtype != dtype_value:
        line = decl.loc.line if decl.loc else 1
        raise ProgramRejected(f"{label}:{line}:1: the Target line says dtype {decl.dtype.value}, the build asks for "
                              f"{dtype_value.value}: build it with --dtype {decl.dtype.value}, or write the program "
                              f"for {dtype_value.value}")
    diagnostics = check(program, target)
    errors = errors_only(diagnostics)
    if errors and then is None:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ProgramRejected(f"{errors[0]}{more}")
    for diagnostic in diagnostics:
        progress(str(diagnostic))
    if errors:
        progress(f"{label}: {len(errors)} checker error(s); the {then.name} provider is asked to repair them")
    custom = _computes_something_else(program)
    progress(f"{label}: {program.variant.name}, {decl.dtype.value}, head dim {decl.head_dim}, for {target.name} "
             f"({target.arch}); " + ("what it computes is not its Variant line's: its own fp64 interpretation is the "
                                     "reference" if custom else "it computes its Variant line: the variant's fp64 "
                                                                "reference"))
    budget = {"max_iters": max_iters} if max_iters is not None else {}
    steps = len(get_args(Phase))  # the program's own steps: sketch, params, translate
    if max_iters is not None and max_iters < steps:
        raise UsageError(f"max_iters {max_iters}: too small, the program's own steps take {steps} "
                         f"({', '.join(get_args(Phase))})")
    goal = goal_speedup if goal_speedup is not None else (1.0 if then else 1e-9)  # no model: none to speed it up
    task = Task(variant=program.variant, target=target.name, arch=target.arch, dtype=dtype_value,
                head_dim=decl.head_dim, head_dim_v=None if decl.head_dim_v == decl.head_dim else decl.head_dim_v)
    try:
        config = LoopConfig(task=task, goal_speedup=goal, budget=Budget(**budget), reference_tl=text if custom else None)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"{first['loc'][-1]}={first.get('input')!r}: {pydantic_message(first)}") from None
    if len(text) > config.max_reply_chars:
        raise UsageError(f"{label}: {len(text)} characters, over the {config.max_reply_chars} a program may have")
    user = UserProgramProvider(text, label, env=env, then=then, custom=custom)
    # the program itself is recorded, so that `flashgen generate --resume N` can go on with it
    info = {"name": USER, "model": None, "file": label, "then": then_info, "program": text, "custom": custom}
    if out is not None:
        check_out_dir(out)
    out_dir = Path(out) if out is not None else None
    where = f"--out {out_dir}" if out_dir is not None else "--out DIR"
    with out_lock(out_dir) if out_dir is not None else nullcontext():
        try:
            result = run_loop(config, user, env=env, store=store, provider_info=info, progress=progress)
        except Interrupted as exc:
            raise Interrupted(str(exc).replace("--out DIR", where), exc.signal_name) from None
        try:
            files = write_outputs(result, result.task, target, env, out_dir)
        except OSError as exc:
            raise FlashgenError(f"--out {out_dir}: cannot write ({exc.strerror or exc}); run {result.run_id} is "
                                "recorded") from None
    if result.best is None:
        partial = f"; partial files in {out_dir}" if out_dir is not None else ""
        hint = result.resume.get("how", f"--resume {result.run_id} continues it").replace("--out DIR", where)
        raise FlashgenError(f"no kernel: {result.reason} (run {result.run_id}; {hint}){partial}")
    best = result.best
    from flashgen.agent.summary import summarize

    summary = summarize(result, files.meta, out_dir, files.written, env.gpu_name() if best.verification.ran else None)
    return Kernel(tl=best.tl, sketch=best.sketch, source=best.cuda, manifest=best.manifest, report=files.report,
                  meta=files.meta, out_dir=out_dir, run_id=result.run_id, summary=summary)


def _computes_something_else(program) -> bool:
    """Whether the program's fp64 interpretation differs from its Variant line's reference (a score or mask of its
    own); a program that cannot even run counts so, and the loop's CPU check then says why."""
    from flashgen.translators.lower import computes_declared_variant

    if program.tensor_decls:  # what its call-time tensors mean, only the program says
        return True
    try:
        return not computes_declared_variant(program)
    except FlashgenError:
        return True
