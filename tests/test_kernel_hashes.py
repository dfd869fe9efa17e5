"""Kernels unchanged: every CUDA source (and launch manifest) the GPU test modules build, and every file under
generated/, hashed and compared with the committed list tests/kernel_hashes.json.

What is hashed:
- `gpu/<module>/<key>`: the sha256 of each kernel a GPU test module builds through its `gpu_kernels(items, arch)`
  hook (tests/gpu_kernels.py), for every parametrization of its tests (not only the selected ones), built here on
  the CPU exactly as the GPU run builds it (`arch`: sm_90, the H200 the GPU suite runs on); `...#manifest` is its
  KernelManifest's JSON. The expert builds use only the first parameter choice, so the search's candidate list is
  not computed here (it takes minutes and changes no source).
- `generated/<path>`: the sha256 of each committed file under generated/ (as
  `cd generated && find . -type f | sort | xargs sha256sum` prints it); and each generated kernel.tl translated
  again for its GPU must give its kernel.cu and manifest.json byte for byte.

A difference is a changed kernel. When the change is intended, make it its own commit, with its reason, and
refresh the list deliberately:

    python tests/test_kernel_hashes.py --write      # rewrites tests/kernel_hashes.json, prints what changed

(`python tests/test_kernel_hashes.py` alone prints the differences without writing.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
HASHES = Path(__file__).with_name("kernel_hashes.json")
GPU_ARCH = "sm_90"
HOOK = "gpu_kernels"
REFRESH = "python tests/test_kernel_hashes.py --write"


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"kernel_hashes_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]


def _parametrizations(fn) -> list[dict]:
    """Every params dict pytest would give `fn` (the product of its parametrize marks; [{}] without any)."""
    axes = []
    for mark in _marks(fn):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for value in values:
            if hasattr(value, "values") and hasattr(value, "marks"):  # pytest.param(...)
                row = tuple(value.values)
            else:
                row = (value,) if len(names) == 1 else tuple(value)
            rows.append(dict(zip(names, row, strict=True)))
        axes.append(rows)
    return [dict(itertools.chain.from_iterable(d.items() for d in combo)) for combo in itertools.product(*axes)]


def _items(module) -> list:
    """Stand-ins for the module's GPU test items, as conftest hands them to the hook: originalname, and
    callspec.params where parametrized."""
    module_gpu = any(m.name == "gpu" for m in _marks(module))
    items = []
    for name, fn in vars(module).items():
        if not (name.startswith("test_") and callable(fn)):
            continue
        if not (module_gpu or any(m.name == "gpu" for m in _marks(fn))):
            continue
        for params in _parametrizations(fn):
            item = SimpleNamespace(originalname=name, name=name)
            if params:
                item.callspec = SimpleNamespace(params=params)
            items.append(item)
    return items


def _key_text(key) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    return "-".join(str(getattr(p, "value", p)) for p in parts)


def gpu_module_paths(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / "tests").glob("test_*.py") if f"def {HOOK}(" in p.read_text())


def kernel_hashes(root: Path = ROOT) -> dict[str, str]:
    """gpu/<module>/<key> (and #manifest) -> sha256 of what each GPU test module's hook builds."""
    import flashgen.translators.search as search

    saved = search.candidate_params
    search.candidate_params = lambda *args, **kwargs: []  # builders take choose_params' first candidate only
    try:
        out: dict[str, str] = {}
        for path in gpu_module_paths(root):
            module = _load(path)
            builds = getattr(module, HOOK)(_items(module), GPU_ARCH)
            label = path.stem.removeprefix("test_")
            for key, build in builds.items():
                built = build.fn(*build.args, **build.kwargs)
                source, manifest = (built.source, built.manifest) if hasattr(built, "source") else built[:2]
                out[f"gpu/{label}/{_key_text(key)}"] = _sha(source)
                out[f"gpu/{label}/{_key_text(key)}#manifest"] = _sha(manifest.model_dump_json())
        return out
    finally:
        search.candidate_params = saved


def generated_hashes(root: Path = ROOT) -> dict[str, str]:
    base = root / "generated"
    return {f"generated/{p.relative_to(base).as_posix()}": _sha(p.read_bytes())
            for p in sorted(base.rglob("*")) if p.is_file()}


def regenerated_mismatches(root: Path = ROOT) -> list[str]:
    """generated/ kernels whose kernel.tl no longer translates to their kernel.cu / manifest.json."""
    from flashgen.targets import get_target
    from flashgen.tl_spec import parse
    from flashgen.translators import translate

    bad = []
    for tl in sorted((root / "generated").glob("*/*/*/kernel.tl")):
        folder = tl.parent
        translation = translate(parse(tl.read_text(), "kernel.tl"), get_target(folder.parts[-3]))
        if translation.source != (folder / "kernel.cu").read_text():
            bad.append(f"{folder.relative_to(root)}/kernel.cu")
        if translation.manifest.model_dump_json(indent=2) + "\n" != (folder / "manifest.json").read_text():
            bad.append(f"{folder.relative_to(root)}/manifest.json")
    return bad


def current_hashes(root: Path = ROOT) -> dict[str, str]:
    return dict(sorted({**kernel_hashes(root), **generated_hashes(root)}.items()))


def differences(want: dict[str, str], have: dict[str, str]) -> list[str]:
    lines = [f"changed: {k}" for k in sorted(want.keys() & have.keys()) if want[k] != have[k]]
    lines += [f"missing now (in the list, not built): {k}" for k in sorted(want.keys() - have.keys())]
    lines += [f"new (built, not in the list): {k}" for k in sorted(have.keys() - want.keys())]
    return lines


@pytest.mark.slow  # about 30 s on 2 cores: some 400 kernels built on the CPU
def test_kernels_and_generated_files_match_the_committed_hashes():
    want = json.loads(HASHES.read_text())
    diff = differences(want, current_hashes())
    assert not diff, (f"{len(diff)} kernel hash(es) differ from {HASHES.name}:\n" + "\n".join(diff[:60])
                      + f"\nAn intended change: its own commit, with its reason, and `{REFRESH}`.")


def test_generated_kernels_translate_again_to_their_files():
    bad = regenerated_mismatches()
    assert not bad, ("these committed generated/ files are not what their kernel.tl translates to now:\n"
                     + "\n".join(bad) + "\nRegenerate them (flashgen generate) in a commit of their own, then "
                     + f"`{REFRESH}`.")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Compare (or, with --write, refresh) tests/kernel_hashes.json.")
    parser.add_argument("--write", action="store_true", help="rewrite tests/kernel_hashes.json")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root to hash (default: this one)")
    parser.add_argument("--out", type=Path, default=HASHES, help="the list to compare with or write")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    have = current_hashes(args.root.resolve())
    want = json.loads(args.out.read_text()) if args.out.is_file() else {}
    diff = differences(want, have)
    print("\n".join(diff) if diff else f"no differences ({len(have)} hashes)")
    if args.write:
        args.out.write_text(json.dumps(have, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.out} ({len(have)} hashes)")
