"""The library job's driver: plan every entry of the spec (its key), keep what the folder already holds under the
same key, hand the rest to an engine, and write each result as it comes back (the entry's folder, the index, the
store's record), so that an interrupted job keeps everything it finished and a rerun redoes only the rest.

    summary = flashgen.library.build("h200.toml", out="lib/")          # or a Spec; engine="ray" for a cluster
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from flashgen.errors import Interrupted, UsageError
from flashgen.library import index as ix
from flashgen.library.engines import EngineStats, LocalEngine, RayEngine, Stages
from flashgen.library.keys import file_digest, key_of, source_digests, toolchain, tuned_mode
from flashgen.library.spec import EntrySpec, Spec, load_spec, parse_variant_name
from flashgen.library.stages import BuildTask, GpuTask


class Planned(BaseModel):
    entry: EntrySpec
    key: str
    target: dict[str, Any]
    backend: str
    parameters: dict[str, Any]


class Row(BaseModel):
    """One entry's line of the summary (what this run did with it)."""

    path: str
    status: str
    action: str = Field(description="built | kept | gpu (built before, verified and timed now) | failed")
    ran_on: str = ""
    time_ms: float | None = None
    speedup: float | None = None
    roofline_ms: float | None = None
    error: str | None = None
    seconds: float | None = None


class JobSummary(BaseModel):
    out: str
    engine: EngineStats | None = None
    entries: int
    built: int = 0
    kept: int = 0
    gpu_run: int = 0
    failed: int = 0
    compiled_and_estimated: int = 0
    plan_s: float = 0.0
    wall_s: float = 0.0
    build_cpu_s: float = Field(default=0.0, description="the builds' seconds added up (CPU stage work)")
    gpu_s: float = 0.0
    run_id: int | None = None
    rows: list[Row] = Field(default_factory=list)


class Reporter(Protocol):
    def start(self, totals: dict[str, int]) -> None: ...
    def advance(self, stage: str, ok: bool, path: str) -> None: ...
    def add(self, stage: str, count: int) -> None: ...
    def stop(self) -> None: ...


class _Silent:
    def start(self, totals): pass
    def advance(self, stage, ok, path): pass
    def add(self, stage, count): pass
    def stop(self): pass


def plan(spec: Spec, only: set[str] | None = None) -> list[Planned]:
    """Every entry (or those whose path is in `only`) with its content key (flashgen.library.keys)."""
    from flashgen.harness.environment import Environment
    from flashgen.targets import get_target
    from flashgen.translators.backends import backend_for
    from flashgen.translators.params import choose_params
    from flashgen.variant import DType

    env, out = Environment(), []
    tools = toolchain()
    provider = spec.provider.model_dump(mode="json")
    with tuned_mode(spec.tuned):
        for entry in spec.entries():
            if only is not None and entry.path not in only:
                continue
            target = get_target(entry.gpu)
            variant = parse_variant_name(entry.variant)
            dtype = DType(entry.dtype)
            backend = backend_for(target, variant, dtype).name
            params = dict(choose_params(variant, target, dtype, entry.head_dim))
            tl = env.library_tl(variant, target, dtype, entry.head_dim, form="full", params=params) \
                if spec.provider.name == "expert" else None
            inputs = {"entry": entry.model_dump(), "target": target.model_dump(mode="json"), "provider": provider,
                      "tuned": spec.tuned, "parameters": params, "tl": tl, "sources": source_digests(backend),
                      "toolchain": tools}
            out.append(Planned(entry=entry, key=key_of(inputs), target=target.model_dump(mode="json"),
                               backend=backend, parameters=params))
    return out


def _files_match(folder: Path, entry: ix.IndexEntry) -> bool:
    try:
        return bool(entry.files) and all(file_digest((folder / name).read_bytes()) == digest
                                         for name, digest in entry.files.items())
    except OSError:
        return False


def _entry_from_meta(p: Planned, meta: dict[str, Any], files: dict[str, str]) -> ix.IndexEntry:
    target = meta.get("target", {})
    roof = (meta.get("roofline") or {}).get("time_s")
    return ix.IndexEntry(path=p.entry.path, target=p.entry.gpu, gpu=target.get("gpu", p.target["marketing_name"]),
                         arch=target.get("arch", p.target["arch"]), dtype=p.entry.dtype, variant=p.entry.variant,
                         variant_fields=meta.get("variant_fields", {}), head_dim=p.entry.head_dim, key=p.key,
                         status="ok", backend=(meta.get("code_path") or {}).get("backend", p.backend),
                         parameters=meta.get("parameters", {}), ran_on=ix.COMPILED_AND_ESTIMATED,
                         verification=meta.get("verification"), timings=meta.get("timings"),
                         roofline_ms=None if roof is None else roof * 1e3,
                         files={name: file_digest(text) for name, text in sorted(files.items())})


def _failed_entry(p: Planned, error: str, ran_on=None, verification=None) -> ix.IndexEntry:
    return ix.IndexEntry(path=p.entry.path, target=p.entry.gpu, gpu=p.target["marketing_name"], arch=p.target["arch"],
                         dtype=p.entry.dtype, variant=p.entry.variant,
                         variant_fields=parse_variant_name(p.entry.variant).model_dump(mode="json"),
                         head_dim=p.entry.head_dim, key=p.key, status="failed", error=error, backend=p.backend,
                         parameters=p.parameters, ran_on=ran_on, verification=verification)


def make_engine(engine: str | Any, *, address: str | None = None, jobs: int | None = None, gpus=None,
                stages: Stages | None = None, spec: Spec | None = None, ray_init: dict | None = None):
    if not isinstance(engine, str):
        return engine
    gpu = spec.gpu if spec is not None else None
    timeout = gpu.timeout_s if gpu else 300.0
    if engine == "local":
        if address is not None:
            raise UsageError("--address is for --engine ray")
        return LocalEngine(jobs=jobs, gpus=gpus, stages=stages, max_attempts=gpu.max_attempts if gpu else 2,
                           gpu_timeout_s=timeout)
    if engine == "ray":
        return RayEngine(address=address, stages=stages, gpu_timeout_s=timeout, init_kwargs=ray_init)
    raise UsageError(f"--engine {engine}: choose local or ray")


def build(spec: Spec | str | Path, out: str | Path | None = None, *, engine: str | Any = "local", address: str | None = None,
          jobs: int | None = None, gpus=None, stages: Stages | None = None, store: Any = None,
          reporter: Reporter | None = None, ray_init: dict | None = None, only: set[str] | None = None,
          force: bool = False) -> JobSummary:
    """Build (or finish building) the library of `spec` in `out`. `gpus`: the GPUs for the GPU stages
    (flashgen.library.gpus.LocalGpu list; default: every visible one; [] for none). `store`: a harness Store, a
    folder for one, None for the default record, False for none. `only`: the entry paths to build (the index keeps
    the others as they were); `force`: build every entry again, whatever the folder holds. Raises UsageError for a bad spec or folder,
    flashgen.errors.Interrupted when SIGINT/SIGTERM stops it (after recording what finished)."""
    from flashgen.agent.outputs import out_lock, write_folder
    from flashgen.api import check_out_dir

    started = time.monotonic()
    spec = load_spec(spec) if isinstance(spec, (str, Path)) else spec
    if out is None and spec.out is None:
        raise UsageError("no library folder: give out= (--out DIR) or out = \"DIR\" in the spec")
    out = Path(out if out is not None else spec.out)
    check_out_dir(out, "--out")
    reporter = reporter or _Silent()
    planned = plan(spec, only)
    order = [e.path for e in spec.entries()]
    plan_s = time.monotonic() - started
    engine_obj = make_engine(engine, address=address, jobs=jobs, gpus=gpus, stages=stages, spec=spec,
                             ray_init=ray_init)
    summary = JobSummary(out=str(out), entries=len(planned), plan_s=round(plan_s, 3))
    own_store = None
    try:
        with out_lock(out):
            out.mkdir(parents=True, exist_ok=True)
            previous = (ix.read_index(out) or ix.Index()).by_path()
            by_path = {p.entry.path: p for p in planned}
            gpu_targets = engine_obj.gpu_targets([_target(p) for p in planned])
            wants_gpu = spec.gpu.verify or spec.gpu.bench
            entries: dict[str, ix.IndexEntry] = {}
            rows: dict[str, Row] = {}
            builds, gpu_tasks = [], []
            for p in planned:
                prev = previous.get(p.entry.path)
                folder = out / p.entry.path
                if prev is not None and not force and prev.key == p.key and prev.status == "ok" and _files_match(folder, prev):
                    entries[p.entry.path] = prev
                    rows[p.entry.path] = _row(prev, "kept")
                    if wants_gpu and p.entry.gpu in gpu_targets and prev.ran_on == ix.COMPILED_AND_ESTIMATED:
                        gpu_tasks.append(_gpu_task(p, folder, spec))
                else:
                    builds.append(BuildTask(entry=p.entry, key=p.key, target=p.target, provider=spec.provider,
                                            tuned=spec.tuned))
            for path in order:  # the entries this run does not build stay as they were
                if path not in by_path and path in previous:
                    entries[path] = previous[path]
            index = ix.Index(spec=spec.model_dump(mode="json"))

            def save() -> None:
                index.entries = [entries[path] for path in order if path in entries]
                ix.write_index(out, index)

            store_obj = _open_store(store)
            own_store = store_obj if store_obj is not None and store_obj is not store else None
            run_id = store_obj.new_run("library", {"out": str(out.absolute()), "spec": spec.model_dump(mode="json"),
                                                   "engine": engine_obj.name}) if store_obj is not None else None
            summary.run_id = run_id

            def record(step: str, payload: dict) -> None:
                if store_obj is not None:
                    store_obj.add_event(run_id, step, payload)

            def on_result(kind: str, result) -> GpuTask | None:
                p = by_path[result.path]
                folder = out / result.path
                follow = None
                if kind == "build":
                    summary.build_cpu_s += result.seconds
                    if result.ok:
                        write_folder(folder, result.files)
                        entries[result.path] = _entry_from_meta(p, result.meta, result.files)
                        rows[result.path] = _row(entries[result.path], "built", result.seconds)
                        if wants_gpu and p.entry.gpu in gpu_targets:
                            follow = _gpu_task(p, folder, spec, result.files, result.meta)
                            reporter.add("gpu", 1)
                    else:
                        entries[result.path] = _failed_entry(p, result.error or "failed")
                        rows[result.path] = _row(entries[result.path], "failed", result.seconds)
                    record("build", result.model_dump(exclude={"files", "meta"}))
                else:
                    summary.gpu_s += result.seconds
                    entry = entries[result.path]
                    if result.ok:
                        files = {name: (folder / name).read_text() for name in entry.files}
                        files["meta.json"] = _meta_text(result.meta)
                        files["report.md"] = result.report
                        write_folder(folder, files)
                        entries[result.path] = entry.model_copy(update={
                            "ran_on": result.ran_on, "verification": result.verification, "timings": result.timings,
                            "files": {name: file_digest(text) for name, text in sorted(files.items())}})
                        action = "built" if rows[result.path].action == "built" else "gpu"
                    else:
                        entries[result.path] = entry.model_copy(update={
                            "status": "failed", "error": result.error, "ran_on": result.ran_on,
                            "verification": result.verification or entry.verification})
                        action = "failed"
                    rows[result.path] = _row(entries[result.path], action,
                                             (rows[result.path].seconds or 0) + result.seconds)
                    record("gpu", result.model_dump(exclude={"meta", "report"}))
                save()  # before anything else can stop the job: the index matches the folders on disk
                reporter.advance(kind, result.ok, result.path)
                return follow

            reporter.start({"plan": len(planned), "build": len(builds), "gpu": len(gpu_tasks)})
            save()
            try:
                summary.engine = engine_obj.run(builds, gpu_tasks, on_result)
            except KeyboardInterrupt as exc:
                reporter.stop()
                signal_name = getattr(exc, "signal_name", "SIGINT")
                done = sum(1 for p in planned if p.entry.path in entries and entries[p.entry.path].key == p.key)
                if store_obj is not None:
                    store_obj.finish_run(run_id, "interrupted", {"entries": len(planned), "recorded": done})
                raise Interrupted(f"interrupted ({signal_name}): {done} of {len(planned)} entries are recorded in "
                                  f"{out / ix.INDEX}; the same command finishes the rest", signal_name) from None
            reporter.stop()
            save()
            ix.write_summary(out, index)
            summary.rows = [rows[p.entry.path] for p in planned if p.entry.path in rows]
            summary.entries = len(summary.rows)
            for row in summary.rows:
                summary.built += row.action == "built"
                summary.kept += row.action == "kept"
                summary.gpu_run += bool(row.ran_on.startswith("GPU"))
                summary.failed += row.status != "ok"
                summary.compiled_and_estimated += row.ran_on == ix.COMPILED_AND_ESTIMATED
            summary.wall_s = round(time.monotonic() - started, 3)
            summary.build_cpu_s = round(summary.build_cpu_s, 3)
            summary.gpu_s = round(summary.gpu_s, 3)
            if store_obj is not None:
                store_obj.finish_run(run_id, "done" if not summary.failed else "failed",
                                     summary.model_dump(exclude={"rows"}, mode="json"))
            return summary
    finally:
        engine_obj.close()
        if own_store is not None:
            own_store.close()


def _target(p: Planned):
    from flashgen.targets import Target

    return Target.model_validate(p.target)


def _open_store(store):
    if store is False:
        return None
    if store is None or isinstance(store, (str, Path)):
        from flashgen.harness.store import Store

        return Store(store) if store is not None else Store()
    return store


def _meta_text(meta: dict[str, Any]) -> str:
    import json

    return json.dumps(meta, indent=2, sort_keys=True) + "\n"


def _gpu_task(p: Planned, folder: Path, spec: Spec, files: dict[str, str] | None = None,
              meta: dict[str, Any] | None = None) -> GpuTask:
    import json

    read = (lambda name: files[name]) if files is not None else (lambda name: (folder / name).read_text())
    return GpuTask(path=p.entry.path, key=p.key, target=p.entry.gpu, source=read("kernel.cu"),
                   manifest=read("manifest.json"), meta=meta if meta is not None else json.loads(read("meta.json")),
                   gpu=spec.gpu)


def _row(entry: ix.IndexEntry, action: str, seconds: float | None = None) -> Row:
    return Row(path=entry.path, status=entry.status, action=action, ran_on=ix._ran_on_text(entry),
               time_ms=entry.time_ms, speedup=entry.speedup, roofline_ms=entry.roofline_ms,
               error=(entry.error or "").splitlines()[0][:300] or None if entry.error else None,
               seconds=None if seconds is None else round(seconds, 3))


__all__ = ["JobSummary", "Planned", "Row", "build", "make_engine", "plan"]
