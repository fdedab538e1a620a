"""Small models shared by the driver tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import Model, OperandType, OperationType
from nnhal.service.server import Service

T = OperandType


def add_model(dims: tuple[int, ...] = (2, 2), out_dims: tuple[int, ...] | None = None,
              quant: bool = False) -> Model:
    """out = a + b (no activation); float32 or quant8 asymm.

    Operands: 0 and 1 the inputs, 2 the activation scalar, 3 the output.
    """
    b = ModelBuilder()
    odims = out_dims if out_dims is not None else dims
    if quant:
        x = b.input(T.TENSOR_QUANT8_ASYMM, dims, 0.5, 10)
        y = b.input(T.TENSOR_QUANT8_ASYMM, dims, 0.5, 10)
        act = b.scalar(T.INT32, 0)
        out = b.output(T.TENSOR_QUANT8_ASYMM, odims, 1.0, 0)
    else:
        x = b.input(T.TENSOR_FLOAT32, dims)
        y = b.input(T.TENSOR_FLOAT32, dims)
        act = b.scalar(T.INT32, 0)
        out = b.output(T.TENSOR_FLOAT32, odims)
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def operator_names(data: bytes, subgraph: int = 0) -> list[str]:
    """The builtin operators of a .tflite flatbuffer's subgraph, in order, by name."""
    import tflite

    m = tflite.Model.GetRootAsModel(data, 0)
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    sg = m.Subgraphs(subgraph)
    out = []
    for i in range(sg.OperatorsLength()):
        oc = m.OperatorCodes(sg.Operators(i).OpcodeIndex())
        out.append(names[max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())])
    return out


def float_inputs(seed: int, dims: tuple[int, ...] = (2, 2)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(dims).astype(np.float32),
            rng.standard_normal(dims).astype(np.float32))


@contextmanager
def served(path: Path, **kw) -> Iterator[Service]:
    """A reference driver served at ``path`` in a thread of this process, stopped after."""
    svc = Service(ReferenceDevice(), path, **kw)
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    try:
        yield svc
    finally:
        svc.stop()
        t.join(5)
        svc.device.close()


def wait_for(pred, timeout: float = 5.0) -> bool:
    """Whether ``pred()`` came true within ``timeout`` seconds (polled every 10 ms)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def served_process(tmp: Path, driver: str, name: str, path: Sequence[str] = ()
                   ) -> Iterator[Path]:
    """``nnhal serve DRIVER`` in its own process (``path``: more PYTHONPATH entries, e.g. a
    plug-in installed only there), yielding the socket's path once the service registered
    itself; stopped after."""
    sock, rt, log = tmp / f"{name}.sock", tmp / "rt", tmp / "service.err"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *path]))
    with open(log, "wb") as err:  # a file, not a pipe: a chatty service never blocks on it
        proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", driver,
                                 "--socket", str(sock), "--runtime-dir", str(rt), "--name",
                                 name], cwd=ROOT, env=env, stderr=err)
    try:
        end = time.monotonic() + 60
        entry = rt / f"{name}.service"
        while not (entry.exists() and f"pid={proc.pid}\n" in entry.read_text()):
            if proc.poll() is not None or time.monotonic() > end:
                proc.kill()
                raise RuntimeError(f"service did not start: {log.read_text()}")
            time.sleep(0.02)
        yield sock
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def assert_reference_refuses(model: Model) -> None:
    """The reference driver supports none of ``model`` (or refuses the query) and refuses to
    prepare it: a bad operation never reaches a kernel."""
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ErrorStatus

    dev = ReferenceDevice()
    try:
        status, flags = dev.get_supported_operations(model)
        assert status != ErrorStatus.NONE or not any(flags), (status, flags)
        cb = PreparedModelCallback()
        dev.prepare_model(model, callback=cb)
        got, prepared = cb.wait(30)
        assert got != ErrorStatus.NONE and prepared is None
    finally:
        dev.close()
