"""The lowering takes `Copy ... as scaled fp16` (bf16/fp32 tiles stored as per-tile scaled fp16) where the tensor
cores lack the dtype (sm_75) and renders exactly what it rendered for the unconverted form; elsewhere it refuses."""

import pytest

from flashgen.tl_spec import library, parse
from flashgen.translators import UnsupportedConstruct, lower, translate
from flashgen.variant import Variant

VARIANT = Variant(causal=True, return_lse=True)


def _sm75(dtype: str) -> str:
    return library.render(VARIANT, dtype=dtype, arch="sm_75")


@pytest.mark.parametrize("gpu", ["t4", "rtx8000"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_converting_load_translates_on_turing_to_the_same_kernel(gpu, dtype):
    converted = _sm75(dtype)
    assert converted.count(" as scaled fp16") == 3
    unconverted = converted.replace(" as scaled fp16", "").replace("] dtype fp16", f"] dtype {dtype}")
    new, old = translate(parse(converted), gpu), translate(parse(unconverted), gpu)
    assert new.plan.arch == "sm_75" and new.plan.dtype.value == dtype
    assert new.source == old.source and new.manifest == old.manifest


@pytest.mark.parametrize("gpu", ["a100", "h200"])
def test_converting_load_is_refused_where_the_tensor_cores_take_the_dtype(gpu):
    text = _sm75("bf16")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "shared Q_s as scaled fp16" in t)
    with pytest.raises(UnsupportedConstruct) as info:
        lower(parse(text), gpu)
    message = str(info.value)
    assert message.startswith(f"line {line}: Copy of Q `as scaled fp16`") and "take bf16" in message


def test_converting_load_is_refused_off_a_global_to_shared_load():
    text = _sm75("bf16").replace("Copy Q_s from shared to register Q_r", "Copy Q_s from shared to register Q_r as "
                                 "scaled fp16")
    with pytest.raises(UnsupportedConstruct, match="Copy of Q_s `as scaled fp16`: only a load from global to shared"):
        lower(parse(text), "t4")
