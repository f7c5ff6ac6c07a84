"""Layout pinning on the CPU: pin files, re-applied pass configs, clear errors on drift."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.numerics import determinism_kernels as D
from tlx.compiler import compile_artifacts
from tlx.options import Options
from tlx.numerics import pin
from tlx.numerics.pin import PinMismatchError

TARGET = {"kind": "cuda", "arch": "sm_90a"}
UNRELATED = {"tl.disable_out_of_bound_warning": True}


@pytest.fixture(scope="module")
def pins(tmp_path_factory):
    """A default GEMM pin and a pin made with wgmma disabled."""
    d = tmp_path_factory.mktemp("pins")
    default = pin.pin_kernel_file(D.gemm(), Options.make(target=TARGET), name="plain_gemm", kernel_file=d / "k.py")
    mma = pin.pin_kernel_file(D.gemm(), Options.make(target=TARGET, pass_configs={"tl.disable_wgmma": True}),
                              name="plain_gemm", kernel_file=d / "k.py", output=d / "mma.pin.json")  # fmt: skip
    return default, mma


def source(**options):
    src, build = compile_artifacts(D.gemm(), Options.make(target=TARGET, verify="off", **options), stop_after="cuda")
    return src, build


def test_pin_file_records_every_decision(pins):
    default, _ = pins
    assert default.name == "plain_gemm.pin.json" and default.parent == pins[1].parent
    data = json.loads(default.read_text())
    d = data["decisions"]
    assert set(d) == set(pin.DECISIONS)
    assert set(d["layouts"]) == {"A_s", "B_s", "C_l"} and d["layouts"]["C_l"].startswith("Fragment:")
    assert any("ptx_wgmma_ss(m64n64k16" in g for g in d["gemm"])
    assert d["pipeline"]["num_stages"] == {"k": 2}
    assert set(d["tma"]) == {"A_desc", "B_desc"}
    assert d["numerics"] == []  # default mode: nvcc's defaults, as under tilelang.jit


def test_pinned_compile_keeps_decisions_and_source_across_unrelated_change(pins):
    default, _ = pins
    free_src, _ = source()
    pinned_src, build = source(pin=str(default), pass_configs=UNRELATED)
    assert build.reports["pin"]["file"] == str(default)
    assert pinned_src == free_src


def test_pin_reapplies_its_pass_configs(pins):
    _, mma = pins
    explicit_src, _ = source(pass_configs={"tl.disable_wgmma": True})
    pinned_src, build = source(pin=str(mma))
    assert build.reports["pin"]["reapplied_pass_configs"] == ["tl.disable_wgmma"]
    assert pinned_src == explicit_src and "wgmma" not in pinned_src.split("extern \"C\" __global__")[-1]


def test_drifted_decision_is_named(pins):
    default, _ = pins
    with pytest.raises(PinMismatchError) as e:
        source(pin=str(default), pass_configs={"tl.disable_wgmma": True})
    msg = str(e.value)
    assert "can no longer honour the pin: fragment C_l: the pinned layout conflicts" in msg and "current layout: Fragment" in msg


def test_pin_reapplies_fragment_layouts(tmp_path):
    """A pin made from a kernel whose reduction tile has a hand-chosen fragment layout holds the
    same kernel written without the annotation to that layout: same generated code."""
    annotated = pin.pin_kernel_file(D.row_sum(tile_layout="by_row_block"), Options.make(target=TARGET), name="row_sum",
                                    kernel_file=tmp_path / "k.py")  # fmt: skip
    data = json.loads(annotated.read_text())
    assert data["fragments"]["tile"]["thread"] == "_i // 16 * 32 + _j" and data["fragments"]["tile"]["index"] == ["_i % 16"]

    def row_sum_source(**options):
        return compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off", **options), stop_after="cuda")

    free_src, _ = row_sum_source()
    pinned_src, build = row_sum_source(pin=str(annotated))
    annotated_src, _ = compile_artifacts(D.row_sum(tile_layout="by_row_block"), Options.make(target=TARGET, verify="off"),
                                         stop_after="cuda")  # fmt: skip
    assert build.reports["pin"]["reapplied_fragments"] == ["acc", "part", "tile"]
    assert pinned_src == annotated_src != free_src


def test_pinned_fragment_missing_from_the_kernel_is_named(tmp_path):
    path = pin.pin_kernel_file(D.row_sum(), Options.make(target=TARGET), name="row_sum", kernel_file=tmp_path / "k.py")
    data = json.loads(path.read_text())
    data["fragments"]["renamed"] = data["fragments"].pop("tile")
    path.write_text(json.dumps(data))
    with pytest.raises(PinMismatchError, match="fragment.s. renamed no longer exist"):
        compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off", pin=str(path)), stop_after="cuda")


def test_numerics_mode_is_pinned(pins):
    default, _ = pins
    with pytest.raises(PinMismatchError, match=r"decisions.numerics: pinned \[\]"):
        source(pin=str(default), numerics="strict")


def test_contradicting_pass_config_is_an_error(pins):
    _, mma = pins
    with pytest.raises(PinMismatchError, match="pass config tl.disable_wgmma is pinned to True but this compile requests False"):
        source(pin=str(mma), pass_configs={"tl.disable_wgmma": False})


def test_bad_pin_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        pin.load_pin(tmp_path / "missing.pin.json")
    (tmp_path / "v0.pin.json").write_text(json.dumps({"version": 0}))
    with pytest.raises(ValueError, match="expected version 2, got 0"):
        pin.load_pin(tmp_path / "v0.pin.json")
    (tmp_path / "partial.pin.json").write_text(json.dumps({"version": 2, "pass_configs": {}, "fragments": {}, "decisions": {"gemm": []}}))
    with pytest.raises(ValueError, match="lacks decisions.layouts"):
        pin.load_pin(tmp_path / "partial.pin.json")


def test_cli_pin_writes_beside_the_kernel(tmp_path):
    kernel_file = tmp_path / "my_kernels.py"
    kernel_file.write_text(
        "import tlx\nfrom tests.numerics import determinism_kernels as D\n\n"
        "@tlx.jit(target={'kind': 'cuda', 'arch': 'sm_90a'})\ndef gemm():\n    return D.gemm()\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tlx.cli", "pin", f"{kernel_file}::gemm"], capture_output=True, text=True,
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    data = pin.load_pin(tmp_path / "gemm.pin.json")
    assert data["kernel"] == "gemm" and data["decisions"]["pipeline"]["num_stages"] == {"k": 2}


def test_missing_pin_file_stops_the_compile(tmp_path):
    with pytest.raises(pin.PinFileError, match="does not exist"):
        source(pin=str(tmp_path / "nope.pin.json"))
