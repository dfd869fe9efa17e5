"""The Ray engine's overhead against the local engine (docs/batch.md), on a local Ray started here with two declared
GPUs of accelerator type H200 (no real GPU needed): 24 entries with tests/library_fakes.py's stages, then generated/'s
8 a100 entries for real (cold compile cache on the local engine, then warm on Ray and warm on the local engine).

    python benchmarks/library_ray_overhead.py          # needs ray (pip install -e '.[ray]'); prints one JSON line
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main():
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    d = tempfile.mkdtemp(prefix="raytime-")
    os.environ["FLASHGEN_HOME"] = d + "/home"
    os.environ["FLASHGEN_FAKE_DIR"] = d
    import ray

    from flashgen import regenerate
    from flashgen.library import build, parse_spec
    from flashgen.library.engines import LocalEngine, RayEngine
    from tests.test_library import FAKES, SPEC, gpus

    res = {}
    t = time.monotonic()
    ray.init(num_cpus=2, num_gpus=2, resources={"accelerator_type:H200": 1}, include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1",
                                                            "FLASHGEN_HOME": d + "/home"}})
    res["ray_start_s"] = round(time.monotonic() - t, 2)
    spec = parse_spec(SPEC)
    for name, eng in (("fake24_local", lambda: LocalEngine(jobs=2, gpus=gpus(2, name="H200 (Ray)"), stages=FAKES)),
                      ("fake24_ray", lambda: RayEngine(stages=FAKES)), ("fake24_ray_again", lambda: RayEngine(stages=FAKES))):
        t = time.monotonic()
        build(spec, f"{d}/{name}", engine=eng(), store=False)
        res[name] = round(time.monotonic() - t, 2)
    real = {p for p in (regenerate.relative_dir(*e).as_posix() for e in regenerate.entries()) if p.startswith("a100/")}
    for name, eng in (("real8_local_cold", lambda: LocalEngine(jobs=2, gpus=[])), ("real8_ray_warm", lambda: RayEngine()),
                      ("real8_local_warm", lambda: LocalEngine(jobs=2, gpus=[]))):
        t = time.monotonic()
        s = build(regenerate.spec(), f"{d}/{name}", engine=eng(), only=real, store=False)
        res[name] = round(time.monotonic() - t, 2)
        res[name + "_work"] = s.build_cpu_s
        res[name + "_failed"] = s.failed
    res["load"] = os.getloadavg()
    print(json.dumps(res), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
