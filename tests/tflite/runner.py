"""Running an imported model on the reference driver and the same .tflite on ai-edge-litert,
with the same inputs, for the agreement tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, OperandType, Priority
from nnhal.tflite import ImportedModel


def operand_dtype(t: int) -> np.dtype:
    t = OperandType(t)
    return np.dtype(np.bool_) if t == OperandType.TENSOR_BOOL8 else np.dtype(t.dtype)


class Reference:
    """An imported model prepared once on the reference driver."""

    def __init__(self, imported: ImportedModel):
        self.imported = imported
        self.device = ReferenceDevice()
        cb = PreparedModelCallback()
        self.device.prepare_model(imported.model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, [], [], b"", cb)
        status, self.prepared = cb.wait(120)
        assert status == ErrorStatus.NONE, f"prepare_model: {status.name}"

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        main = self.imported.model.main
        outs = [main.operands[i] for i in main.output_indexes]
        nbytes = [int(np.prod(o.dimensions)) * operand_dtype(o.type).itemsize for o in outs]
        req = RequestBuilder([np.ascontiguousarray(a) for a in inputs], nbytes)
        try:
            status, shapes, _ = self.prepared.execute_synchronously(req.request,
                                                                   MeasureTiming.NO)
            assert status == ErrorStatus.NONE, f"execute: {status.name}"
            return [req.output(k, operand_dtype(o.type), shapes[k].dimensions)
                    for k, o in enumerate(outs)]
        finally:
            req.close()

    def close(self) -> None:
        self.device.close()


def random_input(dtype: np.dtype, shape: Sequence[int], rng: np.random.Generator
                 ) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def litert(model: str | bytes):
    from ai_edge_litert.interpreter import Interpreter
    if isinstance(model, bytes):
        it = Interpreter(model_content=model)
    else:
        it = Interpreter(model_path=str(model))
    it.allocate_tensors()
    return it


def litert_run(it, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    for d, a in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], a)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def tolerance(expected: np.ndarray) -> float:
    """The agreement the issue asks for: float outputs within 1e-4 of their range (1 when
    the range is 0), quantized ones within one step."""
    if expected.dtype.kind == "c":  # complex: of the magnitudes' range
        mag = np.abs(expected)
        rng = float(mag.max() - mag.min()) if expected.size else 0.0
        return 1e-4 * (rng if rng > 0 else 1.0)
    if expected.dtype.kind == "f":
        rng = float(expected.max() - expected.min()) if expected.size else 0.0
        return 1e-4 * (rng if rng > 0 else 1.0)
    return 1.0


def max_error(got: np.ndarray, expected: np.ndarray) -> float:
    wide = np.complex128 if "c" in (got.dtype.kind, expected.dtype.kind) else np.float64
    return float(np.max(np.abs(got.astype(wide) - expected.astype(wide)), initial=0.0))


def agree(data: bytes, inputs: Sequence[np.ndarray] | None = None, seed: int = 0
          ) -> list[np.ndarray]:
    """Import ``data``, run it on the reference driver and on litert with the same (random
    unless given) inputs, assert agreement within the issue's tolerance; the outputs."""
    from nnhal.tflite import read_tflite

    imported = read_tflite(data)
    it = litert(data)
    rng = np.random.default_rng(seed)
    if inputs is None:
        inputs = [random_input(d["dtype"], d["shape"], rng) for d in it.get_input_details()]
    expected = litert_run(it, inputs)
    ref = Reference(imported)
    try:
        got = ref.run(inputs)
    finally:
        ref.close()
    assert_agree(got, expected)
    return got


def assert_agree(got: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                 what: str = "") -> None:
    """Every output of ours has litert's shape and dtype and is within :func:`tolerance`."""
    assert len(got) == len(expected), f"{what}: {len(got)} outputs, litert {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        if e.shape == () and g.shape == (1,):  # a TFLite scalar is a HAL [1]
            g = g.reshape(())
        assert g.shape == e.shape, f"{what} output {k}: shape {g.shape}, litert {e.shape}"
        assert g.dtype == e.dtype, f"{what} output {k}: dtype {g.dtype}, litert {e.dtype}"
        err, tol = max_error(g, e), tolerance(e)
        assert err <= tol, f"{what} output {k}: max error {err} > {tol}"
