"""TFLite builtins with no HAL operation through nnhal's extension org.nnhal.tflite, on
converter-made models (tests/tflite/data/make_extension_models.py): imported as extension
operations, run through ``Session`` (whole on LiteRT when it is there, which writes them back as
their builtins), ``nnhal run`` and a served reference driver, and
compared with ai-edge-litert on the original file within the README's float tolerance
(1e-4 of the output's range)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_reference_refuses, served_process
from runner import assert_agree, litert, litert_run

from nnhal.hal.types import is_extension_type
from nnhal.session import Session
from nnhal.tflite import custom_support, read_tflite
from nnhal.tflite.import_ext import TfliteCall

pytest.importorskip("ai_edge_litert.interpreter")

DATA = Path(__file__).resolve().parent / "data"
SPECTRUM, COMPLEX, BUILTINS, GELU = (
    DATA / f"{n}.tflite" for n in ("rfft2d_spectrum", "rfft2d_complex", "extension_builtins",
                                   "gelu_gather_nd"))
F = np.float32


def _inputs(path: Path, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-3, 3, d["shape"]).astype(F)
            for d in litert(str(path)).get_input_details()]


def _expected(path: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return litert_run(litert(str(path)), inputs)


def _ext_ops(imported) -> list[str]:
    from nnhal.ops.extensions import operation_name

    table = imported.model.extension_name_to_prefix
    return [operation_name(op.type, table) for op in imported.model.main.operations
            if is_extension_type(op.type)]


def test_rfft2d_model_imports_as_extension_operations() -> None:
    imported = read_tflite(SPECTRUM)
    table = imported.model.extension_name_to_prefix
    assert [(e.name, e.prefix) for e in table] == [("org.nnhal.tflite", 1)]
    assert sorted(_ext_ops(imported)) == sorted(
        ["org.nnhal.tflite:RFFT2D"] * 2 + ["org.nnhal.tflite:COMPLEX_ABS",
                                           "org.nnhal.tflite:REAL"]
        + ["org.nnhal.tflite:IMAG"] * 2)
    # the complex64 temporaries are of the extension's operand type
    main = imported.model.main
    complex_ops = [o for o in main.operands if int(o.type) == (1 << 16 | 0)]
    assert len(complex_ops) == 2 and all(o.dimensions[-1] in (9, 17) for o in complex_ops)


@pytest.mark.parametrize("path", [SPECTRUM, COMPLEX, BUILTINS, GELU], ids=lambda p: p.stem)
def test_reference_driver_agrees_with_litert(path: Path) -> None:
    with Session(str(path), "reference") as s:
        for seed in range(2):
            inputs = _inputs(path, seed)
            assert_agree(list(s.run(inputs).values()), _expected(path, inputs), path.stem)


def test_rfft2d_within_a_float32_rounding_of_litert() -> None:
    """The FFT in float64, rounded once: within 1e-6 of the magnitudes litert computes."""
    inputs = _inputs(COMPLEX, 3)
    with Session(str(COMPLEX), "reference") as s:
        got = s.run(inputs)["Identity"]
    want = _expected(COMPLEX, inputs)[0]
    assert got.dtype == np.complex64 and got.shape == want.shape == (3, 4, 5)
    assert float(np.max(np.abs(got - want))) <= 1e-6 * float(np.max(np.abs(want)))


def test_session_runs_them_whole_on_litert_and_agrees() -> None:
    """Session over every device: LiteRT (when available) runs every operation of these
    models, the extension's too (exported as their builtins), and the LOG and COS, which
    XNNPACK computes wrong at the float32 limits, with XNNPACK off (these models are light:
    nnhal.drivers.litert.support.builtin_kernels); the same outputs as litert."""
    from nnhal.tools.info import plan_info

    for path in (SPECTRUM, COMPLEX, BUILTINS, GELU):
        steps = plan_info(read_tflite(path))
        assert [s["device"] for s in steps] == ["litert"], (path.stem, steps)
        inputs = _inputs(path, 1)
        with Session(str(path)) as s:
            got = s.run(inputs)
        assert_agree(list(got.values()), _expected(path, inputs), path.stem)


def test_nnhal_run_writes_litert_outputs(tmp_path: Path) -> None:
    from nnhal.cli import main

    inputs = _inputs(SPECTRUM, 4)
    np.savez(tmp_path / "in.npz", x=inputs[0])
    assert main(["run", str(SPECTRUM), "--inputs", str(tmp_path / "in.npz"), "--outputs",
                 str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as z:
        got = [z[k] for k in ("Identity", "Identity_1", "Identity_2")]
    assert_agree(got, _expected(SPECTRUM, inputs), "nnhal run")


def test_nnhal_info_names_extension_operations_and_their_device() -> None:
    from nnhal.tools.info import model_info

    info = model_info(read_tflite(SPECTRUM))
    ext = info["extension_operations"]
    assert [e["operation"] for e in ext][:2] == ["org.nnhal.tflite:RFFT2D",
                                                 "org.nnhal.tflite:COMPLEX_ABS"]
    assert all(e["extension"] == "org.nnhal.tflite" and e["runs_on"] == "litert"
               and "reference" in e["supported_by"] and "litert" in e["supported_by"]
               for e in ext), ext
    others = model_info(read_tflite(BUILTINS))["extension_operations"]
    assert others and all(e["runs_on"] == "litert" and "reference" in e["supported_by"]
                          for e in others), others
    assert info["operations"]["org.nnhal.tflite:RFFT2D"] == 2
    assert info["outputs"][0]["type"] == "TENSOR_FLOAT32"
    complex_out = model_info(read_tflite(COMPLEX))["outputs"][0]
    assert complex_out["type"] == "org.nnhal.tflite:TENSOR_COMPLEX64"


def test_a_device_without_the_extension_runs_none_of_it() -> None:
    from nnhal.drivers.reference import ReferenceDevice

    imported = read_tflite(SPECTRUM)
    dev = ReferenceDevice(extensions=())
    try:
        status, flags = dev.get_supported_operations(imported.model)
        assert int(status) == 0
        ext = [is_extension_type(op.type) for op in imported.model.main.operations]
        assert flags == [not e for e in ext]
        assert dev.get_supported_extensions()[1] == []
    finally:
        dev.close()


def test_a_third_party_extension_claims_a_custom_operator() -> None:
    """The hook other extensions use: a custom operator name claimed, its options read by the
    converter, the operation emitted with the model's own prefix."""
    from nnhal.hal.types import OperandType as T
    from nnhal.ops import extensions
    from nnhal.ops.resolver import OperationDef
    from nnhal.ops.signature import Slot

    seen: list[tuple[str, bytes]] = []

    class Copy(OperationDef):
        def validate(self, ctx):  # type: ignore[no-untyped-def]
            pass

        def prepare(self, ctx):  # type: ignore[no-untyped-def]
            return [ctx.inputs[0].shape]

        def kernel(self, ctx):  # type: ignore[no-untyped-def]
            return lambda ins, rt: [np.asarray(ins[0]) * np.float32(ctx.const(1))]

    def convert(call: TfliteCall):  # type: ignore[no-untyped-def]
        call.expect(1)
        seen.append((call.name, call.custom_options))
        return [call.input(0), call.scalar(T.FLOAT32, 2.0)], [call.output(0)]

    op = extensions.operation("com.example.bessel", 0, "I0E", [Slot("x", T.TENSOR_FLOAT32),
                                                               Slot("k", T.FLOAT32)],
                              [Slot("y", T.TENSOR_FLOAT32)], Copy(), tflite=("BesselI0e",),
                              tflite_convert=convert)
    extensions.register(extensions.ExtensionDef("com.example.bessel", (), (op,)))
    try:
        assert custom_support()["BesselI0e"] == "extension (com.example.bessel:I0E)"
        imported = read_tflite(DATA / "refused_rfft2d_custom.tflite")
        assert seen and seen[0][0] == "BesselI0e"
        names = {e.name: e.prefix for e in imported.model.extension_name_to_prefix}
        assert set(names) == {"com.example.bessel", "org.nnhal.tflite"}
        assert sorted(names.values()) == [1, 2]
        assert sorted(_ext_ops(imported)) == ["com.example.bessel:I0E",
                                              "org.nnhal.tflite:CUMSUM",
                                              "org.nnhal.tflite:REAL",
                                              "org.nnhal.tflite:RFFT2D"]
    finally:
        extensions.unregister("com.example.bessel")


# ---- served -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[str]:
    """``nnhal serve reference`` in its own process; the device's name for a Session."""
    with served_process(tmp_path_factory.mktemp("tflext-served"), "reference", "ref") as sock:
        yield f"remote:{sock}"


def test_exact_gelu_agrees_with_litert() -> None:
    """GELU's erf form (the converter leaves tf.nn.gelu's as Erfc, so the operator is made
    here): erf to 1.5e-7 in float64."""
    from runner import agree
    from tfl import Graph, build

    g = Graph()
    x = g.input((4, 64), F)
    y = g.tensor((4, 64), F)
    g.op("GELU", [x], [y], ("GeluOptions", {"Approximate": False}))
    g.output(y)
    data = build(g)
    xs = np.linspace(-6, 6, 256, dtype=F).reshape(4, 64)
    got = agree(data, [xs])[0]
    assert float(np.max(np.abs(got - litert_run(litert(data), [xs])[0]))) < 1e-6


def test_gather_nd_index_out_of_bounds_fails_the_execution() -> None:
    from tfl import Graph, build

    from nnhal.errors import NnhalError

    g = Graph()
    p, i = g.input((3, 4), F), g.input((2, 2), np.int32)
    y = g.tensor((2,), F)
    g.op("GATHER_ND", [p, i], [y])
    g.output(y)
    data = build(g)
    params = np.arange(12, dtype=F).reshape(3, 4)
    with Session(data, "reference") as s:
        got = s.run([params, np.array([[2, 3], [0, 1]], np.int32)])
        np.testing.assert_array_equal(list(got.values())[0], [11, 1])
        with pytest.raises(NnhalError):
            s.run([params, np.array([[3, 0], [0, 1]], np.int32)])
    it = litert(data)
    with pytest.raises(RuntimeError):  # litert's kernel fails it too
        litert_run(it, [params, np.array([[3, 0], [0, 1]], np.int32)])


def test_served_reference_runs_the_extension(served: str) -> None:
    for path in (SPECTRUM, COMPLEX):
        inputs = _inputs(path, 2)
        with Session(str(path), served) as s:
            got = s.run(inputs)
        assert_agree(list(got.values()), _expected(path, inputs), f"served {path.stem}")


# ---- the extension's own rules, on hand-made HAL models ---------------------------------------

def _hal_model(fft_length, in_dims=(2, 8), out_dims=(2, 5), const=True):
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import ExtensionNameAndPrefix
    from nnhal.hal.types import OperandType as T

    mb = ModelBuilder()
    x = mb.input(T.TENSOR_FLOAT32, list(in_dims))
    n = mb.constant(T.TENSOR_INT32, np.asarray(fft_length, np.int32)) if const else \
        mb.input(T.TENSOR_INT32, [len(fft_length)])
    y = mb.output(3 << 16 | 0, list(out_dims))
    mb.operation(3 << 16 | 0, [x, n], [y])
    model = mb.build()
    model.extension_name_to_prefix = [ExtensionNameAndPrefix("org.nnhal.tflite", 3)]
    return model


@pytest.mark.parametrize("fft_length, in_dims, const, why", [
    ([8, 6], (2, 8), True, "powers of two"),
    ([8], (2, 8), True, "two values"),
    ([2, 8], (8,), True, "rank 2 or more"),
    ([2, 8], (2, 8), False, "constant"),
], ids=["not a power of two", "one length", "rank one", "run-time lengths"])
def test_bad_rfft2d_operations_are_refused_not_run(fft_length, in_dims, const, why) -> None:
    """What TFLite's RFFT2D Prepare refuses: the reference driver supports no such
    operation (it never reaches a kernel), and a prepared one is refused."""
    assert_reference_refuses(_hal_model(fft_length, in_dims, const=const))


def test_a_good_hal_rfft2d_model_prepares_and_runs() -> None:
    """The same builder with a valid fft_length: the model the bad ones differ from."""
    model = _hal_model([2, 8], (2, 8), (2, 5))
    x = np.arange(16, dtype=F).reshape(2, 8)
    with Session(model, "reference") as s:
        got = list(s.run([x]).values())[0]
    np.testing.assert_allclose(got, np.fft.rfft2(x.astype(np.float64)), rtol=1e-6, atol=1e-5)


def test_the_reference_cache_restores_extension_operations(tmp_path: Path) -> None:
    """A second compilation with the same token prepares nothing: the plan image carries the
    model's extension table and its complex64 operands."""
    from nnhal.drivers.registry import open_device
    from nnhal.runtime import Compilation, Device, Execution
    from nnhal.runtime import NdkModel as RuntimeModel

    model = read_tflite(COMPLEX).model
    x = _inputs(COMPLEX, 5)[0]
    dev = open_device("reference")
    prepares: list[int] = []
    real = dev.prepare_model
    dev.prepare_model = lambda *a, **k: (prepares.append(1), real(*a, **k))[1]
    outs = []
    try:
        for _ in range(2):
            c = Compilation(RuntimeModel.from_hal(model), [Device("reference", dev)])
            c.set_caching(str(tmp_path), bytes(range(32)))
            c.finish()
            e = Execution(c)
            e.set_input(0, None, x)
            out = np.zeros((3, 4, 5), np.complex64)
            e.set_output(0, None, out)
            e.compute()
            outs.append(out)
            c.free()
    finally:
        dev.close()
    assert len(prepares) == 1
    np.testing.assert_array_equal(outs[0], outs[1])
    assert_agree([outs[1]], _expected(COMPLEX, [x]), "from the cache")


def test_a_complex_input_passed_through_is_refused_in_one_line() -> None:
    """A complex64 model input that is also an output needs a copy, which nothing makes for
    an extension type: refused by name, not a traceback."""
    from tfl import Graph, build
    from tflite.TensorType import TensorType as TT

    from nnhal.errors import UnsupportedModelError

    g = Graph()
    z = g.input((2, 3), TT.COMPLEX64)
    r = g.tensor((2, 3), F)
    g.op("REAL", [z], [r])
    g.output(r, z)
    with pytest.raises(UnsupportedModelError, match="cannot copy an operand of extension type"):
        read_tflite(build(g))
