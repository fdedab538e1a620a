"""JAX for the XLA driver: the device it compiles for, the analysed model compiled ahead of
time into one XLA executable, its weights in device memory, and the executable's bytes for
the compilation cache.

``jax`` is imported only here and only when a device is opened or a model compiled, so that
importing the driver (and listing devices) never needs it (see :func:`unavailable`).

An :class:`Executable` is run through JAX's runtime executable (``LoadedExecutable``) rather
than ``jax.stages.Compiled``, so that a fresh compilation and one restored from a cache run
the same way: ``Client.serialize_executable`` gives the compiled code's bytes (no pickle, no
recompilation on restore) and ``Client.deserialize_executable`` loads them again. XLA's
executables are safe to run from many threads at once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.analysis import ModelGraph
from nnhal.drivers.xla.lowering import (
    Weight,
    build_function,
    fast_weights,
    uses_quantized,
    weights_of,
)

#: How a relaxed float32 model computes: ``float16`` (the fast format), ``float32`` (as
#: written, XLA's default precision), or unset: float16 on an accelerator, float32 on the CPU
#: (whose float16 arithmetic is slower than its float32). Read at each preparation.
RELAXED_ENV = "NNHAL_XLA_RELAXED"
_RELAXED_CHOICES = {"float16": np.dtype(np.float16), "float32": None}


def unavailable() -> str | None:
    """None when JAX can be loaded and has a device, else why not (one line)."""
    try:
        import jax

        jax.devices()
    except Exception as e:  # noqa: BLE001 - any failure to load means "not available"
        return (f"jax is not importable ({type(e).__name__}: {e}); "
                "install it with pip install 'nnhal[xla]'")
    return None


def default_device() -> Any:
    """The device JAX prefers: a GPU when it finds one, else the CPU."""
    import jax

    return jax.devices()[0]


def platform(device: Any) -> str:
    """What a compiled executable is bound to: JAX version, platform and device kind."""
    import jax

    return f"jax {jax.__version__} {device.platform} {device.device_kind}"


def relaxed_dtype(device: Any) -> np.dtype | None:
    """The fast dtype relaxed float models compute in on ``device`` (None: float32); see
    :data:`RELAXED_ENV`. An unknown value is an error, not a silent default."""
    want = os.environ.get(RELAXED_ENV, "").strip().lower()
    if not want:
        return None if device.platform == "cpu" else np.dtype(np.float16)
    if want not in _RELAXED_CHOICES:
        shown = want if len(want) <= 40 else want[:40] + "..."
        raise ValueError(f"{RELAXED_ENV}={shown!r}: expected one of "
                         f"{', '.join(_RELAXED_CHOICES)}")
    return _RELAXED_CHOICES[want]


def putter(device: Any) -> Any:
    """A function moving one host array to ``device``: JAX's batched transfer called directly
    (6 us for two small inputs here, against 57 us through ``jax.device_put``'s Python
    layers), or ``jax.device_put`` when this JAX has no such private entry point."""
    import jax

    try:
        from jax._src import core
        from jax._src.lib import xla_client as xc

        sharding = jax.sharding.SingleDeviceSharding(device)
        avals: dict[tuple[Any, ...], Any] = {}
        batched = xc.batched_device_put

        def put(x: np.ndarray) -> Any:
            key = (x.shape, x.dtype)
            aval = avals.get(key)
            if aval is None:
                aval = avals[key] = core.ShapedArray(x.shape, x.dtype)
            return batched(aval, sharding, [x], [device], True)

        probe = np.arange(3, dtype=np.float32)
        if not np.array_equal(np.asarray(put(probe)), probe):
            raise RuntimeError("batched_device_put gave another array")
        return put
    except Exception:  # noqa: BLE001 - another JAX: its public call
        return lambda x: jax.device_put(x, device)


class Executable:
    """One compiled model: the loaded executable, its weights in device memory, and the
    device. :meth:`run` takes the inputs as host arrays or device arrays (a memory domain's
    buffer: passed as they are, no copy) and returns the outputs as device arrays;
    :meth:`run_host` returns them as host arrays (views of the device buffers on the CPU)."""

    __slots__ = ("loaded", "device", "weights", "weight_table", "put", "_execute", "_on_cpu")

    def __init__(self, loaded: Any, device: Any, weight_table: Sequence[Weight],
                 weight_values: Sequence[np.ndarray]):
        import jax

        self.loaded = loaded
        self.device = device
        self.weight_table = list(weight_table)
        self.weights = [jax.device_put(v, device) for v in weight_values]
        #: One host array to the device (a host-to-device transfer on an accelerator).
        self.put = putter(device)
        self._execute = loaded.execute_sharded
        self._on_cpu = device.platform == "cpu"

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """The outputs as device arrays, left on the device (nothing waits for them)."""
        put = self.put
        args = self.weights + [put(a) if isinstance(a, np.ndarray) else a for a in inputs]
        return [r[0] for r in self._execute(args).disassemble_into_single_device_arrays()]

    def to_host(self, outs: Sequence[Any]) -> list[np.ndarray]:
        """Device arrays as host arrays. On an accelerator every transfer is started before
        the first is waited for (one wait, the copies overlapped); on the CPU a host array is
        a view of the device buffer."""
        if not self._on_cpu and len(outs) > 1:
            for r in outs:
                r.copy_to_host_async()
        return [np.asarray(r) for r in outs]

    def run_host(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        return self.to_host(self.run(inputs))

    def serialize(self) -> bytes:
        return bytes(self.device.client.serialize_executable(self.loaded))

    def weight_bytes(self) -> list[np.ndarray]:
        """The weights as host arrays (what a data cache stores)."""
        return [np.asarray(w) for w in self.weights]


def compile_graph(graph: ModelGraph, device: Any) -> Executable:
    """The main subgraph lowered and compiled ahead of time for ``device``. float32 models
    compute at full float32 precision (HIGHEST: no TF32 or bfloat16 passes on a GPU); a
    relaxed model lets XLA choose its default (faster) precision and, without quantized
    operands, computes in float16 where :func:`relaxed_dtype` says so (on a GPU): its float
    weights cast once here, its activations in float16, its outputs cast back.

    A model with quantized operands is traced with JAX's 64-bit types enabled (the reference
    requantisation's products need them; see :mod:`nnhal.drivers.xla.quantized`), in a
    ``jax.enable_x64`` block: scoped to this thread and this compilation, never the process's
    setting. The executable keeps the model's own input and output types, so running it (from
    any thread, or restored from the cache) needs no such flag."""
    import jax
    from jax import lax

    main = graph.main
    quantized = uses_quantized(graph)
    table = weights_of(graph)
    precision = None if graph.relaxed else lax.Precision.HIGHEST
    fast = relaxed_dtype(device) if graph.relaxed and not quantized else None
    if fast is not None:
        table = fast_weights(graph, table, fast)
    fn = build_function(graph, table, precision, fast)
    # float32 -> float16 rounds to nearest; beyond float16's range it is inf, as the HAL's
    # relaxed computation allows.
    with np.errstate(over="ignore"):
        values = [np.asarray(main.operands[w.index].value).astype(np.dtype(w.dtype))
                  .reshape(w.shape) for w in table]
    specs = [jax.ShapeDtypeStruct(w.shape, np.dtype(w.dtype)) for w in table]
    specs += [jax.ShapeDtypeStruct(tuple(main.shapes[i]), main.operands[i].type.dtype)
              for i in main.inputs]
    with jax.default_device(device), jax.enable_x64(quantized):
        compiled = jax.jit(fn, keep_unused=True).lower(*specs).compile()
    return Executable(compiled.runtime_executable(), device, table, values)


def restore(code: bytes, device: Any, weight_table: Sequence[Weight],
            weight_values: Sequence[np.ndarray]) -> Executable:
    """An executable from :meth:`Executable.serialize`'s bytes, loaded on ``device``
    without compiling again. Only ever given bytes this driver wrote and authenticated:
    loading an executable runs its code."""
    from jax._src.lib import xla_client as xc

    loaded = device.client.deserialize_executable(
        code, executable_devices=xc.DeviceList((device,)))
    return Executable(loaded, device, weight_table, weight_values)
