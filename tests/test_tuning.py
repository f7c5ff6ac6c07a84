"""``tlx.autotune`` and TileLang's autotuner over ``@tlx.jit`` kernels: tuning compiles through
tlx, and the chosen configuration is recorded in (and re-applied from) the pin file."""

import json

import pytest
import tilelang

import tlx
from tests import jit_kernels as J
from tlx.kernel import Kernel
from tlx.tuning import call_key


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path / "cache"))


def test_tilelang_autotune_stacks_on_tlx_jit():
    tuned = tilelang.autotune(configs=J.TUNING_CONFIGS)(J.tunable_scale)
    kernel = tuned(512, block=64)  # every tunable given: TileLang's tuner compiles it directly, no benchmark
    assert isinstance(kernel, Kernel) and kernel.params[0].shape == [512]


def test_tlx_autotune_reuses_the_pinned_choice_without_tuning(tmp_path):
    pin = tmp_path / "scale.pin.json"
    pin.write_text(json.dumps({"version": 2, "autotune": {call_key(J.tunable_scale, (512,), {}): {"config": {"block": 64}}}}))
    tuned = tlx.autotune(configs=J.TUNING_CONFIGS, pin=pin)(J.tunable_scale)
    kernel = tuned(512)  # on a machine without a GPU: tuning would fail, the pinned choice compiles
    assert kernel.config == {"block": 64}
    assert kernel.metadata["launches"][0]["block"][0] == "64"


def test_tlx_autotune_rejects_other_functions():
    with pytest.raises(TypeError, match="tlx.autotune: expected a @tlx.jit function, got function"):
        tlx.autotune(configs=[{}])(lambda: None)


def test_tlx_pin_keeps_the_recorded_choice_and_the_file_still_pins_layouts(tmp_path):
    from tlx.jit import Options
    from tlx.numerics import pin

    path = tmp_path / "tunable.pin.json"
    choice = {call_key(J.tunable_scale, (512,), {}): {"config": {"block": 64}}}
    path.write_text(json.dumps({"version": pin.PIN_VERSION, "autotune": choice}))
    pin.pin_kernel_file(J.tunable_scale.get_tir(512, block=64), Options.make(target=J.SM90), name="tunable_scale",
                        kernel_file=tmp_path / "k.py", output=path)
    data = json.loads(path.read_text())
    assert data["autotune"] == choice and "decisions" in data
    kernel = tlx.autotune(configs=J.TUNING_CONFIGS, pin=path)(tlx.jit(out_idx=[-1], target=J.SM90, pin=str(path))(J.tunable_scale.factory))(512)
    assert kernel.config == {"block": 64} and kernel.metadata["reports"]["pin"]["file"] == str(path)


@pytest.mark.gpu
def test_tlx_autotune_records_the_choice_in_the_pin_file(tmp_path):
    pin = tmp_path / "tuned.pin.json"
    tuned = tlx.autotune(configs=J.TUNING_CONFIGS, pin=pin, warmup=1, rep=3)(J.tunable_scale)
    kernel = tuned(1 << 16)
    entry = next(iter(json.loads(pin.read_text())["autotune"].values()))
    assert entry["config"] in J.TUNING_CONFIGS and entry["config"] == kernel.config
    again = tlx.autotune(configs=J.TUNING_CONFIGS, pin=pin)(J.tunable_scale)(1 << 16)
    assert again.directory == kernel.directory  # the recorded choice, compiled without tuning


EAGER_TUNING_CONFIGS = [{"block_M": 16, "block_N": 32}, {"block_M": 32, "block_N": 64}]


@pytest.mark.parametrize("autotune", [tlx.autotune, tilelang.autotune], ids=["tlx", "tilelang"])
def test_autotuned_eager_kernel_compiles_with_consts_by_keyword(autotune):
    # example_gemv / example_blocksparse_gemm: `.compile(M=..., N=..., <every tunable>)` on an
    # eager kernel, naming T.const values that are not parameters of the function
    tuned = autotune(configs=EAGER_TUNING_CONFIGS)(tlx.jit(target=J.SM90)(J.eager_add.factory))
    kernel = tuned.compile(M=64, N=128, block_M=16, block_N=32)
    assert isinstance(kernel, Kernel)
    assert [p.shape for p in kernel.params] == [[64, 128]] * 3


def test_call_key_keeps_consts_given_by_keyword_apart_from_parameters():
    key = call_key(J.eager_add, (), {"N": 128, "M": 64, "block_M": 16})
    assert json.loads(key) == {"block_M": 16, "T.const": {"M": 64, "N": 128}}
    assert key == call_key(J.eager_add, (), {"block_M": 16, "M": 64, "N": 128})  # keyword order does not matter
    assert key != call_key(J.eager_add, (), {"N": 128, "M": 32, "block_M": 16})
