"""Where the library job's stages run. An engine takes the CPU tasks (builds; with tuned = "search" also the
search's candidates) and the GPU tasks (verify and bench; the search's timing), runs them, and hands every result to
the driver's `on_result(kind, result)` in the driver's thread (`kind`: the task's stage); the driver answers with the
task that follows (or None), which the engine schedules where it runs (`task.on_gpu`): a build's GPU task, a
search's timing after its candidates, the build after a search. Results only come back: the driver alone writes the
library and the store.

- `LocalEngine` (the default, no Ray): the builds in a process pool sized to the usable CPUs (spawned processes;
  a pool broken by a dying process is replaced and its unfinished builds submitted again, once); the GPU tasks on one
  thread per visible GPU, each driving its own GPU worker process (flashgen.harness.worker.GpuWorker). A worker that
  dies with a task loses only that task, which goes back to the queue for another worker of the same target (up to
  `gpu.max_attempts` workers); a worker that loses two tasks in a row retires. A search's timing (TuneTask) is a GPU
  task like the others, on the entry's GPU worker.
- `RayEngine` (`--engine ray [--address ADDR]`, the `ray` extra): builds as CPU-only tasks (num_cpus=1), GPU tasks
  with num_gpus=1 and accelerator_type set to the target's Ray type (flashgen.library.gpus.ray_accelerator_type),
  each retried up to `max_retries` times when its worker or node is lost.
"""

from __future__ import annotations

import importlib
import os
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pydantic import BaseModel, Field

from flashgen.errors import UsageError
from flashgen.library.gpus import LocalGpu, ray_accelerator_type
from flashgen.library.stages import BuildTask, CandidatesTask, GpuTask, TuneTask

CpuTask = BuildTask | CandidatesTask
AnyGpuTask = GpuTask | TuneTask
OnResult = Callable[[str, Any], "CpuTask | AnyGpuTask | None"]


class Stages(BaseModel):
    """The stage functions, by import path (so that spawned processes and Ray workers find them; tests name fakes)."""

    build: str = "flashgen.library.stages:build_entry"
    gpu: str = "flashgen.library.stages:gpu_entry"
    worker: str = "flashgen.library.engines:make_gpu_worker"
    candidates: str = "flashgen.library.stages:candidates_entry"  # tuned = "search": the search's CPU half
    tune: str = "flashgen.library.stages:tune_entry"  # and its GPU half

    def of(self, task) -> str:
        """The stage function's path for a task (its `stage` names the field)."""
        return getattr(self, task.stage)


class EngineStats(BaseModel):
    engine: str
    cpu_workers: int = 0
    gpu_workers: list[dict[str, Any]] = Field(default_factory=list)
    gpu_retries: int = 0
    retired: list[str] = Field(default_factory=list)
    build_resubmits: int = 0


def resolve(path: str) -> Callable:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def make_gpu_worker(gpu: LocalGpu, timeout_s: float):
    from flashgen.harness.worker import GpuWorker

    return GpuWorker(device=gpu.index, job_timeout_s=timeout_s)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _pool_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides what an interrupt stops
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _call(path: str, task):
    return resolve(path)(task)


class _GpuQueue:
    """GPU tasks waiting for a worker of their target; a task a worker lost goes to another worker first."""

    def __init__(self, gpus: list[LocalGpu], events: queue.Queue):
        self.cv = threading.Condition()
        self.pending: list[GpuTask] = []
        self.alive = {self.wid(g): g for g in gpus}
        self.closed = False
        self.events = events

    @staticmethod
    def wid(gpu: LocalGpu) -> str:
        return f"{gpu.host}:{gpu.index}"

    def targets(self) -> set[str]:
        with self.cv:
            return {g.target for g in self.alive.values() if g.target}

    def put(self, task: AnyGpuTask) -> None:
        with self.cv:
            if not any(g.target == task.target for g in self.alive.values()):
                self.events.put((task.stage, task.failed(f"no GPU worker of {task.target} is left (lost on "
                                                         f"{', '.join(task.tried) or 'none'})")))
                return
            self.pending.append(task)
            self.cv.notify_all()

    def take(self, gpu: LocalGpu) -> AnyGpuTask | None:
        me = self.wid(gpu)
        with self.cv:
            while True:
                if self.closed or me not in self.alive:
                    return None
                mine = [t for t in self.pending if t.target == gpu.target]
                others = [w for w, g in self.alive.items() if g.target == gpu.target]
                task = next((t for t in mine if me not in t.tried), None) or \
                    next((t for t in mine if all(w in t.tried for w in others)), None)
                if task is not None:
                    self.pending.remove(task)
                    return task
                self.cv.wait(0.5)

    def retire(self, gpu: LocalGpu) -> None:
        with self.cv:
            self.alive.pop(self.wid(gpu), None)
            stranded = [t for t in self.pending if not any(g.target == t.target for g in self.alive.values())]
            for task in stranded:
                self.pending.remove(task)
                self.events.put((task.stage, task.failed(f"no GPU worker of {task.target} is left (lost on "
                                                         f"{', '.join(task.tried)})")))
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()


class LocalEngine:
    name = "local"

    def __init__(self, *, jobs: int | None = None, gpus: list[LocalGpu] | None = None, stages: Stages | None = None,
                 max_attempts: int = 2, gpu_timeout_s: float = 300.0, retire_after: int = 2):
        from flashgen.library.gpus import local_gpus

        self.jobs = max(1, jobs or usable_cpus())
        self.gpus = local_gpus() if gpus is None else gpus
        self.stages = stages or Stages()
        self.max_attempts = max_attempts
        self.gpu_timeout_s = gpu_timeout_s
        self.retire_after = retire_after
        self.stats = EngineStats(engine=self.name, cpu_workers=self.jobs,
                                 gpu_workers=[g.describe() | {"target": g.target} for g in self.gpus])

    def gpu_targets(self, targets: list | None = None) -> set[str]:
        return {g.target for g in self.gpus if g.target}

    def close(self) -> None:
        pass

    def _gpu_loop(self, gpu: LocalGpu, work: _GpuQueue, events: queue.Queue, workers: list) -> None:
        make = resolve(self.stages.worker)
        worker, streak, me = None, 0, work.wid(gpu)
        try:
            while (task := work.take(gpu)) is not None:
                try:
                    if worker is None:
                        worker = make(gpu, self.gpu_timeout_s)
                        workers.append(worker)
                    result = resolve(self.stages.of(task))(task, worker, gpu)
                except Exception as exc:  # noqa: BLE001 - a broken stage function is that entry's error
                    result = task.failed(f"{type(exc).__name__}: {exc}")
                if not result.lost:
                    streak = 0
                    events.put((task.stage, result))
                    continue
                streak += 1
                task = task.model_copy(update={"tried": [*task.tried, me]})
                if len(task.tried) < self.max_attempts:
                    self.stats.gpu_retries += 1
                    work.put(task)
                else:
                    events.put((task.stage, result.model_copy(update={
                        "error": f"{result.error} (lost on {len(task.tried)} workers: {', '.join(task.tried)})"})))
                if streak >= self.retire_after:
                    self.stats.retired.append(me)
                    break
        finally:
            work.retire(gpu)
            if worker is not None:
                try:
                    worker.close()
                except Exception:  # noqa: BLE001 - a dead worker closes as well as it can
                    pass

    def run(self, builds: list[CpuTask], gpu_tasks: list[AnyGpuTask], on_result: OnResult) -> EngineStats:
        import multiprocessing as mp

        events: queue.Queue = queue.Queue()
        work = _GpuQueue(self.gpus, events)
        workers: list = []
        threads = [threading.Thread(target=self._gpu_loop, args=(g, work, events, workers), daemon=True,
                                    name=f"flashgen-library-gpu{g.index}") for g in self.gpus if g.target]
        for thread in threads:
            thread.start()
        ctx = mp.get_context("spawn")
        pool = None
        outstanding = 0
        attempts: dict[tuple[str, str], int] = {}
        # a search's entry comes back to the pool for its build: size the pool for those too
        cpu_work = len(builds) + sum(isinstance(t, CandidatesTask) for t in builds)

        def new_pool():
            return ProcessPoolExecutor(max_workers=min(self.jobs, max(1, cpu_work)), mp_context=ctx,
                                       initializer=_pool_init)

        def submit(task: CpuTask) -> None:
            nonlocal pool
            slot = (task.stage, task.entry.path)
            attempts[slot] = attempts.get(slot, 0) + 1
            if pool is None:
                pool = new_pool()
            try:
                future = pool.submit(_call, self.stages.of(task), task)
            except BrokenProcessPool:
                pool.shutdown(wait=False, cancel_futures=True)
                pool = new_pool()
                future = pool.submit(_call, self.stages.of(task), task)

            def done(f, task=task):
                try:
                    events.put((task.stage, f.result()))
                except BrokenProcessPool:
                    events.put(("cpu-lost", task))
                except BaseException as exc:  # noqa: BLE001 - an unpicklable result, a cancelled future
                    events.put((task.stage, task.failed(f"{type(exc).__name__}: {exc}")))

            future.add_done_callback(done)

        def schedule(task) -> None:
            if task.on_gpu:
                work.put(task)
            else:
                submit(task)

        interrupted = False
        try:
            for task in [*builds, *gpu_tasks]:
                schedule(task)
                outstanding += 1
            while outstanding:
                try:
                    kind, result = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if kind == "cpu-lost":
                    slot = (result.stage, result.entry.path)
                    if attempts[slot] < 2:
                        self.stats.build_resubmits += 1
                        submit(result.model_copy(update={"attempt": attempts[slot] + 1}))
                        continue
                    kind, result = result.stage, result.failed(f"the {result.stage} process died (twice)")
                outstanding -= 1
                follow = on_result(kind, result)
                if follow is not None:
                    outstanding += 1
                    schedule(follow)
        except BaseException:
            interrupted = True
            raise
        finally:
            work.close()
            if pool is not None:
                processes = list(getattr(pool, "_processes", {}).values())
                pool.shutdown(wait=not interrupted, cancel_futures=True)
                for process in processes if interrupted else []:  # our own pool's processes, by their handles
                    if process.is_alive():
                        process.terminate()
            for thread in threads:
                thread.join(1 if interrupted else 30)
        return self.stats


# ------------------------------------------------------------------------------------------------ Ray


class WorkerLost(Exception):
    """A GPU task's worker process died with it (Ray retries the task: retry_exceptions)."""


def _ray_build(path: str, task: CpuTask):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    return resolve(path)(task)


def _ray_gpu(gpu_path: str, worker_path: str, task: AnyGpuTask, timeout_s: float):
    import socket

    import ray

    from flashgen.targets import get_target

    ids = ray.get_gpu_ids()
    name = f"{ray_accelerator_type(get_target(task.target))} (Ray)"  # the device's own name when cupy reads it
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:  # noqa: BLE001 - no cupy here (a test's fake GPU): the Ray id names it
        pass
    gpu = LocalGpu(index=0, name=name, target=task.target, visible_id=str(ids[0]) if ids else "",
                   host=socket.gethostname())
    worker = resolve(worker_path)(gpu, timeout_s)
    try:
        result = resolve(gpu_path)(task, worker, gpu)
    finally:
        try:
            worker.close()
        except Exception:  # noqa: BLE001
            pass
    if result.lost:
        raise WorkerLost(result.error or "the GPU worker died")
    return result


class RayEngine:
    name = "ray"

    def __init__(self, *, address: str | None = None, stages: Stages | None = None, max_retries: int = 3,
                 gpu_timeout_s: float = 300.0, init_kwargs: dict[str, Any] | None = None):
        try:
            import ray
        except ImportError:
            raise UsageError("--engine ray needs Ray: pip install 'flashgen[ray]' (or pip install ray)") from None
        self.ray = ray
        self.stages = stages or Stages()
        self.max_retries = max_retries
        self.gpu_timeout_s = gpu_timeout_s
        self.started_here = False
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
            except Exception as exc:  # noqa: BLE001 - no cluster at that address, a bad address: one line
                raise UsageError(f"--engine ray: cannot reach a Ray cluster at {address or 'a new local one'}: "
                                 f"{' '.join(str(exc).split())[:300]}") from None
            self.started_here = True
        resources = ray.cluster_resources()
        self.stats = EngineStats(engine=self.name, cpu_workers=int(resources.get("CPU", 0)),
                                 gpu_workers=[{"resource": k, "count": v} for k, v in sorted(resources.items())
                                              if k == "GPU" or k.startswith("accelerator_type:")])
        self.resources = resources

    def gpu_targets(self, targets: list | None = None) -> set[str]:
        """The targets whose Ray accelerator type some node of the cluster has (with GPUs)."""
        from flashgen.targets import TARGETS

        if not self.resources.get("GPU"):
            return set()
        return {t.name for t in (targets or TARGETS.values())
                if self.resources.get(f"accelerator_type:{ray_accelerator_type(t)}")}

    def run(self, builds: list[CpuTask], gpu_tasks: list[AnyGpuTask], on_result: OnResult) -> EngineStats:
        from flashgen.targets import get_target

        ray = self.ray
        build_remote = ray.remote(_ray_build).options(num_cpus=1, max_retries=self.max_retries)
        gpu_remote = ray.remote(_ray_gpu)
        refs: dict = {}

        def submit(task) -> None:
            if not task.on_gpu:
                refs[build_remote.remote(self.stages.of(task), task)] = (task.stage, task)
                return
            ref = gpu_remote.options(num_cpus=1, num_gpus=1, max_retries=self.max_retries, retry_exceptions=[WorkerLost],
                                     accelerator_type=ray_accelerator_type(get_target(task.target))).remote(
                self.stages.of(task), self.stages.worker, task, self.gpu_timeout_s)
            refs[ref] = (task.stage, task)

        for task in [*builds, *gpu_tasks]:
            submit(task)
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                for ref in ready:
                    kind, task = refs.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - lost past its retries, or the task itself failed
                        text = " ".join(str(exc).split())[:500]
                        result = task.failed(f"lost on Ray after {self.max_retries} retries: {text}")
                    follow = on_result(kind, result)
                    if follow is not None:
                        submit(follow)
        except BaseException:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise
        return self.stats

    def close(self) -> None:
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()
