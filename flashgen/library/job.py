"""The library job's driver: plan every entry of the spec (its key), keep what the folder already holds under the
same key, hand the rest to an engine, and write each result as it comes back (the entry's folder, the index, the
store's record), so that an interrupted job keeps everything it finished and a rerun redoes only the rest.

    summary = flashgen.library.build("h200.toml", out="lib/")          # or a Spec; engine="ray" for a cluster

With `tuned = "search"` an entry whose target has a GPU here is searched first (its candidates on the CPU, their
verification and timing on the GPU: flashgen.library.stages), then keyed with the parameters the search chose: kept
when the folder holds that key, else built with them and verified and timed. A search recorded in the index for the
same inputs (its search key) is reused, not run again (`retune=True` runs it again). Where no GPU of the target is
here, the packaged or default parameters are taken and the index's `tuning` says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from flashgen.errors import Interrupted, UsageError
from flashgen.library import index as ix
from flashgen.library.engines import EngineStats, LocalEngine, RayEngine, Stages
from flashgen.library.keys import file_digest, key_of, search_digest, source_digests, toolchain, tuned_mode
from flashgen.library.spec import EntrySpec, Spec, load_spec, parse_variant_name
from flashgen.library.stages import BuildTask, CandidatesTask, Chosen, GpuTask, TuneTask, canonical_params

# the index's error for an entry whose search finished and whose build has not (yet): a rerun builds it, reusing
# the recorded search
PENDING = "searched, not built yet: the job stopped before its build with the chosen parameters came back (the same " \
          "command builds it, reusing the recorded search)"


class Planned(BaseModel):
    entry: EntrySpec
    key: str
    target: dict[str, Any]
    backend: str
    parameters: dict[str, Any]
    tuning: dict[str, Any] | None = Field(default=None, description='tuned = "search": where the parameters came '
                                          "from (the index's `tuning`)")
    search_key: str | None = None
    searches: bool = Field(default=False, description="its search runs in this job (a GPU of its target is here and no "
                           "recorded search is for these inputs); `key` and `parameters` are the fallback's until then")


class Row(BaseModel):
    """One entry's line of the summary (what this run did with it)."""

    path: str
    status: str
    action: str = Field(description="built | kept | gpu (built before, verified and timed now) | failed")
    ran_on: str = ""
    params_from: str = Field(default="", description='tuned = "search": search (this run) | search (recorded) | '
                             "fallback")
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
    searched: int = Field(default=0, description="searches run by this job that chose parameters")
    fallback: int = Field(default=0, description='tuned = "search": entries on the packaged or default parameters')
    plan_s: float = 0.0
    wall_s: float = 0.0
    build_cpu_s: float = Field(default=0.0, description="the builds' seconds added up (CPU stage work)")
    gpu_s: float = 0.0
    search_cpu_s: float = Field(default=0.0, description="the searches' candidates (screen, nvcc), added up")
    search_gpu_s: float = Field(default=0.0, description="the searches' verification and timing, added up")
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


def search_inputs(spec: Spec, entry: EntrySpec, target, backend: str, tools: str,
                  fallback: dict[str, Any]) -> dict[str, Any]:
    """What a search's result follows (its key): the entry, the target's facts, the [search] settings, the fallback
    parameters (always a candidate), the sources of the entry's translation, the search's own code and the
    toolchain."""
    return {"entry": entry.key_dump(), "target": target.model_dump(mode="json"),
            "search": spec.search_settings.model_dump(mode="json"), "fallback": fallback,
            "sources": source_digests(backend), "search_code": search_digest(), "toolchain": tools}


def _planned(spec: Spec, env, entry: EntrySpec, target, backend: str, params: dict[str, Any], tools: str,
             params_from: str | None = None, **fields) -> Planned:
    """The entry keyed with these parameters (and, with tuned = "search", where they came from)."""
    from flashgen.variant import DType

    variant = parse_variant_name(entry.variant)
    tl = env.library_tl(variant, target, DType(entry.dtype), entry.head_dim, form="full", params=params,
                        head_dim_v=entry.head_dim_v) if spec.provider.name == "expert" else None
    inputs = {"entry": entry.key_dump(), "target": target.model_dump(mode="json"),
              "provider": spec.provider.model_dump(mode="json"), "tuned": spec.tuned, "parameters": params, "tl": tl,
              "sources": source_digests(backend), "toolchain": tools}
    if params_from is not None:
        inputs["parameters_from"] = params_from
    return Planned(entry=entry, key=key_of(inputs), target=target.model_dump(mode="json"), backend=backend,
                   parameters=params, **fields)


def _recorded_search(prev: ix.IndexEntry | None, search_key: str) -> dict[str, Any] | None:
    tuning = prev.tuning if prev is not None else None
    if tuning and tuning.get("source") == "search" and tuning.get("search_key") == search_key and tuning.get("winner"):
        return tuning
    return None


def plan(spec: Spec, only: set[str] | None = None, *, previous: dict[str, ix.IndexEntry] | None = None,
         gpu_targets: set[str] | frozenset[str] = frozenset(), retune: bool = False) -> list[Planned]:
    """Every entry (or those whose path is in `only`) with its content key (flashgen.library.keys). With tuned =
    "search": an entry whose `previous` index entry holds a search for the same inputs takes its winner (unless
    `retune` and a GPU of its target is here); else one whose target is in `gpu_targets` is to be searched; else it
    takes the packaged or default parameters (its `tuning` says why)."""
    from flashgen.harness.environment import Environment
    from flashgen.targets import get_target
    from flashgen.translators.backends import backend_for
    from flashgen.translators.params import choose_params_with_source
    from flashgen.variant import DType

    env, out = Environment(), []
    tools = toolchain()
    previous = previous or {}
    with tuned_mode(spec.tuned):
        for entry in spec.entries():
            if only is not None and entry.path not in only:
                continue
            target = get_target(entry.gpu)
            variant = parse_variant_name(entry.variant)
            dtype = DType(entry.dtype)
            backend = backend_for(target, variant, dtype).name
            choice = choose_params_with_source(variant, target, dtype, entry.head_dim, head_dim_v=entry.head_dim_v)
            params = dict(choice.params)
            if spec.tuned != "search":
                out.append(_planned(spec, env, entry, target, backend, params, tools))
                continue
            search_key = key_of(search_inputs(spec, entry, target, backend, tools, params))
            prev = previous.get(entry.path)
            recorded = _recorded_search(prev, search_key)
            here = entry.gpu in gpu_targets
            if recorded is not None and not (retune and here):
                winner = canonical_params(recorded["winner"])
                out.append(_planned(spec, env, entry, target, backend, winner, tools, "search", tuning=recorded,
                                    search_key=search_key))
                continue
            if here:
                note = f"the search on a GPU of {entry.gpu} did not come back"  # replaced when it does
            else:
                note = f"no GPU of {entry.gpu} here to search on"
                if prev is not None and (prev.tuning or {}).get("source") == "search":
                    note += " (the recorded search was for other inputs: sources, [search] settings or toolchain)"
            tuning = {"source": "fallback", "search_key": search_key, "note": note,
                      "parameters_from": f"{choice.source}: {choice.detail}"}
            out.append(_planned(spec, env, entry, target, backend, params, tools, "fallback", tuning=tuning,
                                search_key=search_key, searches=here))
    return out


def _files_match(folder: Path, entry: ix.IndexEntry) -> bool:
    try:
        return bool(entry.files) and all(file_digest((folder / name).read_bytes()) == digest
                                         for name, digest in entry.files.items())
    except OSError:
        return False


def _keepable(prev: ix.IndexEntry | None, p: Planned, folder: Path) -> bool:
    return prev is not None and prev.key == p.key and prev.status == "ok" and _files_match(folder, prev)


def _entry_from_meta(p: Planned, meta: dict[str, Any], files: dict[str, str]) -> ix.IndexEntry:
    target = meta.get("target", {})
    roof = (meta.get("roofline") or {}).get("time_s")
    return ix.IndexEntry(path=p.entry.path, target=p.entry.gpu, gpu=target.get("gpu", p.target["marketing_name"]),
                         arch=target.get("arch", p.target["arch"]), dtype=p.entry.dtype, variant=p.entry.variant,
                         variant_fields=meta.get("variant_fields", {}), head_dim=p.entry.head_dim,
                         head_dim_v=p.entry.head_dim_v, key=p.key,
                         status="ok", backend=(meta.get("code_path") or {}).get("backend", p.backend),
                         parameters=meta.get("parameters", {}), tuning=p.tuning, ran_on=ix.COMPILED_AND_ESTIMATED,
                         verification=meta.get("verification"), timings=meta.get("timings"),
                         roofline_ms=None if roof is None else roof * 1e3,
                         files={name: file_digest(text) for name, text in sorted(files.items())})


def _failed_entry(p: Planned, error: str, ran_on=None, verification=None) -> ix.IndexEntry:
    return ix.IndexEntry(path=p.entry.path, target=p.entry.gpu, gpu=p.target["marketing_name"], arch=p.target["arch"],
                         dtype=p.entry.dtype, variant=p.entry.variant,
                         variant_fields=parse_variant_name(p.entry.variant).model_dump(mode="json"),
                         head_dim=p.entry.head_dim, head_dim_v=p.entry.head_dim_v, key=p.key, status="failed",
                         error=error, backend=p.backend,
                         parameters=p.parameters, tuning=p.tuning, ran_on=ran_on, verification=verification)


def _chosen(tuning: dict[str, Any] | None) -> Chosen | None:
    """The build's view of a recorded search's winner."""
    if not tuning or tuning.get("source") != "search" or not tuning.get("winner"):
        return None
    best = next((c for c in tuning.get("candidates", []) if c.get("params") == tuning["winner"]), {})
    return Chosen(params=canonical_params(tuning["winner"]), label=tuning.get("winner_label", ""),
                  geomean_ms=float(tuning.get("winner_geomean_ms") or best.get("geomean_ms") or 0.0),
                  times_ms=dict(best.get("times_ms", {})),
                  candidates_timed=sum("geomean_ms" in c for c in tuning.get("candidates", [])),
                  gpu=(tuning.get("on") or {}).get("name", ""))


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
          force: bool = False, retune: bool = False) -> JobSummary:
    """Build (or finish building) the library of `spec` in `out`. `gpus`: the GPUs for the GPU stages
    (flashgen.library.gpus.LocalGpu list; default: every visible one; [] for none). `store`: a harness Store, a
    folder for one, None for the default record, False for none. `only`: the entry paths to build (the index keeps
    the others as they were); `force`: build every entry again, whatever the folder holds; `retune` (tuned =
    "search"): search again where a GPU of the target is here, even where a search for the same inputs is recorded
    (an entry whose search chooses what it chose before is kept). Raises UsageError for a bad spec or folder,
    flashgen.errors.Interrupted when SIGINT/SIGTERM stops it (after recording what finished)."""
    from flashgen.agent.outputs import out_lock, write_folder
    from flashgen.api import check_out_dir
    from flashgen.harness.environment import Environment
    from flashgen.targets import get_target

    started = time.monotonic()
    spec = load_spec(spec) if isinstance(spec, (str, Path)) else spec
    if out is None and spec.out is None:
        raise UsageError("no library folder: give out= (--out DIR) or out = \"DIR\" in the spec")
    out = Path(out if out is not None else spec.out)
    check_out_dir(out, "--out")
    reporter = reporter or _Silent()
    order = [e.path for e in spec.entries()]
    engine_obj = make_engine(engine, address=address, jobs=jobs, gpus=gpus, stages=stages, spec=spec,
                             ray_init=ray_init)
    summary = JobSummary(out=str(out), entries=0)
    own_store = None
    try:
        with out_lock(out):
            out.mkdir(parents=True, exist_ok=True)
            previous = (ix.read_index(out) or ix.Index()).by_path()
            gpu_targets = engine_obj.gpu_targets([get_target(gpu) for gpu in spec.gpus])
            planning = time.monotonic()
            planned = plan(spec, only, previous=previous, gpu_targets=gpu_targets, retune=retune)
            summary.entries, summary.plan_s = len(planned), round(time.monotonic() - planning, 3)
            by_path = {p.entry.path: p for p in planned}
            wants_gpu = spec.gpu.verify or spec.gpu.bench
            entries: dict[str, ix.IndexEntry] = {}
            rows: dict[str, Row] = {}
            spent: dict[str, float] = {}
            searched_now: set[str] = set()
            builds, gpu_tasks = [], []
            searches = [p for p in planned if p.searches]
            # nvcc processes per search's candidates: the pool's processes shared among the searches
            compile_jobs = max(1, getattr(engine_obj, "jobs", 1) // max(1, len(searches)))
            for p in planned:
                prev = previous.get(p.entry.path)
                folder = out / p.entry.path
                if p.searches:
                    builds.append(CandidatesTask(entry=p.entry, key=p.search_key, target=p.target,
                                                 search=spec.search_settings, fallback=p.parameters, jobs=compile_jobs))
                elif not force and _keepable(prev, p, folder):
                    entries[p.entry.path] = prev if p.tuning is None else prev.model_copy(update={"tuning": p.tuning})
                    rows[p.entry.path] = _row(entries[p.entry.path], "kept")
                    if wants_gpu and p.entry.gpu in gpu_targets and prev.ran_on == ix.COMPILED_AND_ESTIMATED:
                        gpu_tasks.append(_gpu_task(p, folder, spec))
                else:
                    builds.append(_build_task(p, spec))
            for path in order:  # the entries this run does not build stay as they were
                if path not in by_path and path in previous:
                    entries[path] = previous[path]
            index = ix.Index(spec=spec.index_dump())

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

            def row(path: str, action: str) -> Row:
                return _row(entries[path], action, spent.get(path), searched=path in searched_now)

            def after_search(p: Planned, chosen: Chosen | None, tuning: dict[str, Any]):
                """The entry keyed with what its search chose (or its fallback): kept where the folder holds that
                key, else built."""
                path = p.entry.path
                if chosen is not None:
                    p = _planned(spec, Environment(), p.entry, _target(p), p.backend, canonical_params(chosen.params),
                                 toolchain(),
                                 "search", tuning=tuning, search_key=p.search_key)
                else:
                    p = p.model_copy(update={"tuning": tuning, "searches": False})
                by_path[path] = p
                prev = previous.get(path)
                folder = out / path
                if not force and _keepable(prev, p, folder):
                    entries[path] = prev.model_copy(update={"tuning": tuning})
                    rows[path] = row(path, "kept")
                    if wants_gpu and p.entry.gpu in gpu_targets and prev.ran_on == ix.COMPILED_AND_ESTIMATED:
                        reporter.add("gpu", 1)
                        return _gpu_task(p, folder, spec)
                    return None
                entries[path] = _failed_entry(p, PENDING)  # recorded, so that a rerun reuses the search
                rows[path] = row(path, "failed")
                reporter.add("build", 1)
                return _build_task(p, spec, chosen)

            def on_result(kind: str, result):
                p = by_path[result.path]
                path = result.path
                folder = out / path
                spent[path] = spent.get(path, 0.0) + result.seconds
                follow, advance = None, kind
                if kind == "candidates":
                    summary.search_cpu_s += result.seconds
                    record("candidates", result.model_dump(exclude={"candidates"}) | {
                        "compiled": [c.label for c in result.candidates if c.alive]})
                    if result.ok and any(c.alive for c in result.candidates):
                        return TuneTask(path=path, key=result.key, target=p.entry.gpu, entry=p.entry,
                                        candidates=result.candidates, screened=result.screened, passed=result.passed,
                                        fallback=p.parameters, search=spec.search_settings, gpu=spec.gpu)
                    why = result.error or "no candidate compiled: " + "; ".join(
                        f"{c.label}: {c.dropped}" for c in result.candidates)[:800]
                    follow = after_search(p, None, {**(p.tuning or {}), "note": f"the search's candidates: {why}"})
                    advance = "search"
                elif kind == "tune":
                    summary.search_gpu_s += result.seconds
                    record("tune", result.model_dump())
                    if result.ok and result.chosen is not None:
                        summary.searched += 1
                        searched_now.add(path)
                        tuning = {"source": "search", "search_key": p.search_key, **result.search}
                        follow = after_search(p, result.chosen, tuning)
                    else:
                        follow = after_search(p, None, {**(p.tuning or {}), "note": result.error or "the search failed",
                                                        **({"search": result.search} if result.search else {})})
                    advance = "search"
                elif kind == "build":
                    summary.build_cpu_s += result.seconds
                    if result.ok:
                        write_folder(folder, result.files)
                        entries[path] = _entry_from_meta(p, result.meta, result.files)
                        rows[path] = row(path, "built")
                        if wants_gpu and p.entry.gpu in gpu_targets:
                            follow = _gpu_task(p, folder, spec, result.files, result.meta)
                            reporter.add("gpu", 1)
                    else:
                        entries[path] = _failed_entry(p, result.error or "failed")
                        rows[path] = row(path, "failed")
                    record("build", result.model_dump(exclude={"files", "meta"}))
                else:
                    summary.gpu_s += result.seconds
                    entry = entries[path]
                    if result.ok:
                        files = {name: (folder / name).read_text() for name in entry.files}
                        files["meta.json"] = _meta_text(result.meta)
                        files["report.md"] = result.report
                        write_folder(folder, files)
                        entries[path] = entry.model_copy(update={
                            "ran_on": result.ran_on, "verification": result.verification, "timings": result.timings,
                            "files": {name: file_digest(text) for name, text in sorted(files.items())}})
                        action = "built" if rows[path].action == "built" else "gpu"
                    else:
                        entries[path] = entry.model_copy(update={
                            "status": "failed", "error": result.error, "ran_on": result.ran_on,
                            "verification": result.verification or entry.verification})
                        action = "failed"
                    rows[path] = row(path, action)
                    record("gpu", result.model_dump(exclude={"meta", "report"}))
                save()  # before anything else can stop the job: the index matches the folders on disk
                reporter.advance(advance, result.ok, path)
                return follow

            reporter.start({"plan": len(planned), "build": sum(isinstance(t, BuildTask) for t in builds),
                            "gpu": len(gpu_tasks), "search": len(searches)})
            save()
            try:
                summary.engine = engine_obj.run(builds, gpu_tasks, on_result)
            except KeyboardInterrupt as exc:
                reporter.stop()
                signal_name = getattr(exc, "signal_name", "SIGINT")
                done = sum(1 for p in by_path.values() if p.entry.path in entries and entries[p.entry.path].key == p.key
                           and entries[p.entry.path].error != PENDING)
                if store_obj is not None:
                    store_obj.finish_run(run_id, "interrupted", {"entries": len(planned), "recorded": done})
                raise Interrupted(f"interrupted ({signal_name}): {done} of {len(planned)} entries are recorded in "
                                  f"{out / ix.INDEX}; the same command finishes the rest", signal_name) from None
            reporter.stop()
            save()
            ix.write_summary(out, index)
            summary.rows = [rows[p.entry.path] for p in planned if p.entry.path in rows]
            summary.entries = len(summary.rows)
            for r in summary.rows:
                summary.built += r.action == "built"
                summary.kept += r.action == "kept"
                summary.gpu_run += bool(r.ran_on.startswith("GPU"))
                summary.failed += r.status != "ok"
                summary.compiled_and_estimated += r.ran_on == ix.COMPILED_AND_ESTIMATED
                summary.fallback += r.params_from == "fallback"
            summary.wall_s = round(time.monotonic() - started, 3)
            for name in ("build_cpu_s", "gpu_s", "search_cpu_s", "search_gpu_s"):
                setattr(summary, name, round(getattr(summary, name), 3))
            if store_obj is not None:
                store_obj.finish_run(run_id, "done" if not summary.failed else "failed",
                                     summary.model_dump(exclude={"rows"}, mode="json"))
            return summary
    finally:
        engine_obj.close()
        if own_store is not None:
            own_store.close()


def _build_task(p: Planned, spec: Spec, chosen: Chosen | None = None) -> BuildTask:
    return BuildTask(entry=p.entry, key=p.key, target=p.target, provider=spec.provider, tuned=spec.tuned,
                     chosen=chosen or _chosen(p.tuning))


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


def _row(entry: ix.IndexEntry, action: str, seconds: float | None = None, searched: bool = False) -> Row:
    source = (entry.tuning or {}).get("source", "")
    params_from = f"search ({'this run' if searched else 'recorded'})" if source == "search" else source
    return Row(path=entry.path, status=entry.status, action=action, ran_on=ix._ran_on_text(entry),
               params_from=params_from, time_ms=entry.time_ms, speedup=entry.speedup, roofline_ms=entry.roofline_ms,
               error=(entry.error or "").splitlines()[0][:300] or None if entry.error else None,
               seconds=None if seconds is None else round(seconds, 3))


__all__ = ["JobSummary", "Planned", "Row", "build", "make_engine", "plan"]
