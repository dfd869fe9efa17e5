"""The library job on a local Ray cluster started here (ray.init with two declared GPUs of accelerator type H200 and
no real GPU; the stages are tests/library_fakes.py's): one build task's process killed mid-run and retried by Ray,
one entry failing on purpose and recorded, an interrupted job resumed to the same library as an uninterrupted one,
and the same library as the local engine's. Skipped where Ray is not installed (pip install 'flashgen[ray]')."""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from flashgen.errors import Interrupted  # noqa: E402
from flashgen.library import build, parse_spec  # noqa: E402
from flashgen.library.engines import LocalEngine, RayEngine  # noqa: E402
from flashgen.library.index import COMPILED_AND_ESTIMATED, read_index  # noqa: E402
from tests.test_library import FAIL, FAKES, SPEC, gpus, normalized, same_files  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KILL = "h200/bf16/plain_d128"

pytestmark = pytest.mark.slow  # a Ray cluster's start: about 10 s here


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray")
    env = {"PYTHONPATH": str(REPO), "FLASHGEN_FAKE_FAIL": FAIL, "FLASHGEN_FAKE_KILL": KILL,
           "FLASHGEN_FAKE_DIR": str(folder), "FLASHGEN_HOME": str(folder / "home"), "OPENBLAS_NUM_THREADS": "1"}
    ray.init(num_cpus=2, num_gpus=2, resources={"accelerator_type:H200": 1}, include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": env})
    yield folder
    ray.shutdown()


class StopAfter:
    def __init__(self, n):
        self.n = n

    def start(self, totals): pass
    def add(self, stage, count): pass
    def stop(self): pass

    def advance(self, stage, ok, path):
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


def test_ray_engine_builds_the_library_retries_a_killed_task_and_resumes(cluster, monkeypatch):
    for name, value in (("FLASHGEN_HOME", str(cluster / "home")), ("FLASHGEN_FAKE_FAIL", FAIL),
                        ("FLASHGEN_FAKE_KILL", KILL), ("FLASHGEN_FAKE_DIR", str(cluster))):
        monkeypatch.setenv(name, value)  # the driver's own processes (the local engine's pool) as the Ray workers
    spec = parse_spec(SPEC)
    engine = RayEngine(stages=FAKES)
    assert not engine.started_here and engine.gpu_targets() == {"h200"}
    whole = cluster / "whole"
    summary = build(spec, whole, engine=engine, store=cluster / "store")
    by = read_index(whole).by_path()
    assert len(by) == 24 and summary.engine.engine == "ray"
    assert (cluster / (KILL.replace("/", "_") + ".killed")).is_file() and by[KILL].status == "ok"  # killed, retried
    assert by[FAIL].status == "failed" and "planted failure" in by[FAIL].error
    h200 = [e for e in by.values() if e.target == "h200"]
    assert all(e.ran_on["name"] == "H200 (Ray)" and e.ran_on["visible_id"] in ("0", "1") for e in h200)
    assert all(e.ran_on == COMPILED_AND_ESTIMATED for e in by.values() if e.target == "a100" and e.status == "ok")

    part = cluster / "part"
    with pytest.raises(Interrupted):
        build(spec, part, engine=RayEngine(stages=FAKES), store=False, reporter=StopAfter(9))
    done = {e.path for e in read_index(part).entries if e.status == "ok"}
    assert 0 < len(done) < 24
    again = build(spec, part, engine=RayEngine(stages=FAKES), store=False)
    assert {r.path for r in again.rows if r.action in ("kept", "gpu")} == done
    assert set(same_files(whole, part)) <= {"library.md"} and normalized(whole) == normalized(part)  # .md: devices

    local = cluster / "local"  # the local engine, on two declared GPUs named as the Ray fakes are
    build(spec, local, engine=LocalEngine(jobs=2, gpus=gpus(2, name="H200 (Ray)"), stages=FAKES), store=False)
    strip = lambda index: [{k: v for k, v in e.items() if k != "ran_on"} for e in index["entries"]]  # noqa: E731
    assert set(same_files(whole, local)) <= {"library.md"} and strip(normalized(whole)) == strip(normalized(local))


def test_ray_accelerator_types_are_rays_own_names():
    from ray.util import accelerators as ra

    from flashgen.library.gpus import RAY_ACCELERATOR_TYPES, ray_type_of_name
    from flashgen.targets import TARGETS

    assert RAY_ACCELERATOR_TYPES["t4"] == ra.NVIDIA_TESLA_T4 and RAY_ACCELERATOR_TYPES["a100"] == ra.NVIDIA_A100
    assert RAY_ACCELERATOR_TYPES["h100"] == ra.NVIDIA_H100 and RAY_ACCELERATOR_TYPES["l4"] == ra.NVIDIA_L4
    assert RAY_ACCELERATOR_TYPES["h200"] == getattr(ra, "NVIDIA_H200", "H200")
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager as manager

    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA A100-SXM4-80GB", "Quadro RTX 8000",
                 "NVIDIA GeForce RTX 4090", "NVIDIA L4", "NVIDIA A10"):
        assert ray_type_of_name(name) == manager._gpu_name_to_accelerator_type(name), name
    assert set(RAY_ACCELERATOR_TYPES) <= set(TARGETS)


def test_ray_engine_runs_the_search_on_the_gpu_tasks_and_builds_the_winner(cluster, monkeypatch):
    """tuned = "search": the candidates as a CPU task, their timing as a GPU task of the entry's accelerator type, the
    build with the winner as a CPU task again; a rerun keeps both entries without searching."""
    from flashgen.library.engines import Stages

    monkeypatch.setenv("FLASHGEN_HOME", str(cluster / "home"))
    stages = Stages(build="tests.library_fakes:fake_build", worker="tests.library_fakes:make_worker",
                    candidates="tests.library_fakes:fake_candidates")
    spec = parse_spec({"gpus": ["h200"], "dtypes": ["fp16"], "variants": ["plain", "causal"], "head_dims": [64],
                       "tuned": "search", "search": {"max_candidates": 3, "lengths": [1024]}})
    lib = cluster / "searched"
    summary = build(spec, lib, engine=RayEngine(stages=stages), store=False)
    assert summary.searched == 2 and summary.failed == 0 and summary.gpu_run == 2
    for e in read_index(lib).entries:
        assert e.tuning["source"] == "search" and e.tuning["on"]["name"] == "H200 (Ray)"
        assert e.parameters == e.tuning["winner"] and len(e.tuning["candidates"]) == 3
    again = build(spec, lib, engine=RayEngine(stages=stages), store=False)
    assert again.kept == 2 and again.searched == 0
