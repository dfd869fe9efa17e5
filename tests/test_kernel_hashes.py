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
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HASHES = Path(__file__).with_name("kernel_hashes.json")
GPU_ARCH = "sm_90"
REFRESH = "python tests/test_kernel_hashes.py --write"


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"kernel_hashes_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _key_text(key) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    return "-".join(str(getattr(p, "value", p)) for p in parts)


def kernel_hashes(root: Path = ROOT) -> dict[str, str]:
    """gpu/<module>/<key> (and #manifest) -> sha256 of what each GPU test module's hook builds."""
    import flashgen.translators.search as search
    from tests.gpu_kernels import every_build, gpu_module_paths  # here: the script puts --root on sys.path first

    saved = search.candidate_params
    search.candidate_params = lambda *args, **kwargs: []  # builders take choose_params' first candidate only
    try:
        out: dict[str, str] = {}
        modules = [_load(path) for path in gpu_module_paths(root)]
        for (label, key), build in every_build(modules, GPU_ARCH).items():
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
