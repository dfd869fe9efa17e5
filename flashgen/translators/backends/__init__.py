"""The CUDA translator's code paths: one `Backend` per folder, chosen once per `flashgen.targets.Target`.

    backend = backend_for(target)      # the first of BACKENDS whose supports(target) holds
    backend = get_backend(plan.backend)

A backend folder holds the Backend subclass (its `__init__.py` defines BACKEND), its template(s) extending the shared
skeleton (translators/templates/attention_fwd.cu.j2) and its arch header(s) under include/flashgen/. Adding one: a
new folder and its line in BACKENDS below (docs/translators.md).
"""

from __future__ import annotations

from flashgen.errors import UsageError
from flashgen.targets import Target
from flashgen.translators.backends import sm75, sm80, sm90
from flashgen.translators.backends.base import Backend

#: every backend, in the order backend_for tries them
BACKENDS: tuple[Backend, ...] = (
    sm75.BACKEND,
    sm90.BACKEND,  # before sm80: it takes the H100/H200 for what it implements (Sm90Backend.accepts)
    sm80.BACKEND,
)


def backend_for(target: Target, variant=None, dtype=None, roles: bool | None = None) -> Backend:
    """The backend that translates for `target` (the one place a code path is chosen): the first that supports the
    target and accepts the variant and dtype where they are given (fp32 or split-KV on sm_90: the sm80 path), and,
    where `roles` is given, translates that dataflow (True: the Hopper dataflow's Role blocks; False: the plain one)."""
    for backend in BACKENDS:
        if backend.supports(target) and backend.accepts(variant, dtype) \
                and (roles is None or backend.role_dataflow == roles):
            return backend
    raise UsageError(f"no translator backend for {target.name} ({target.arch}); backends: "
                     + ", ".join(f"{b.name} ({', '.join(b.archs)})" for b in BACKENDS))


def get_backend(name: str) -> Backend:
    """The backend called `name` (KernelPlan.backend)."""
    for backend in BACKENDS:
        if backend.name == name:
            return backend
    raise UsageError(f"unknown translator backend {name!r}; known: {', '.join(b.name for b in BACKENDS)}")


def include_dirs() -> list:
    """Every backend's include folder (each holds flashgen/<arch header>), for nvcc's -I."""
    return [b.include_dir for b in BACKENDS if b.include_dir.is_dir()]


__all__ = ["BACKENDS", "Backend", "backend_for", "get_backend", "include_dirs"]
