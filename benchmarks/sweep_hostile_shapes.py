# ruff: noqa: E501, E702, E731, B023
# (dense case tables of lambdas; every lambda runs in the iteration that makes it)
"""Hostile shapes against every entry point: HAL models (ModelBuilder) of the operations
whose signatures allow ranks above 4, and .tflite files (tests/tflite/tfl.py) of the builtins
the importer maps, with ranks 5 to 100 (8 and 9 around TFLite's broadcast bound, 32 and 33
around nditer's, 64 and 65 around numpy's) and dimensions 0, 1, 2, 2^31-1 (alone
and in threes: products past 2^63), through the analysis, Session(model, "reference") with a
run, the runtime (Session(model)), read_tflite and Session(bytes), and (``capi``) the HAL
models built, compiled and run through libneuralnetworks.so as a C client does, where every
call must answer one of the NDK's result codes, (``service``) on a served reference
driver, across the wire, and (``aidl``) through the reference driver's AIDL face. Anything
but nnhal's own
error (NnhalError, or the analysis' ValidationError / OpError), a run past 10 s, a crash
(faulthandler prints it) or a numpy RuntimeWarning (run with -W error::RuntimeWarning) is
printed as BUG. The CI keeps a handful of these cases (tests/test_hostile_shapes.py,
tests/tflite/test_import_rules.py); this is the wide sweep (5,579 models, about 10 s here).

    python benchmarks/sweep_hostile_shapes.py [hal|tflite|capi|service|aidl|all] [CASE,CASE] [RANK,RANK]

Memory is capped at 5 GiB (RLIMIT_AS): an unbounded allocation shows as a MemoryError BUG
instead of swapping the machine.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import signal
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "tflite"))

from tfl import Graph, build  # noqa: E402

from nnhal.analysis import analyse  # noqa: E402
from nnhal.errors import NnhalError  # noqa: E402
from nnhal.hal.builder import ModelBuilder  # noqa: E402
from nnhal.hal.types import OperandLifeTime as L  # noqa: E402
from nnhal.hal.types import OperandType as T  # noqa: E402
from nnhal.hal.types import OperationType as O  # noqa: E402
from nnhal.ops.resolver import OpError  # noqa: E402
from nnhal.session import Session  # noqa: E402
from nnhal.tflite import read_tflite  # noqa: E402
from nnhal.validation.model import ValidationError  # noqa: E402

OK = (NnhalError, ValidationError, OpError)
F32, I32, BOOL, Q8 = T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_BOOL8, T.TENSOR_QUANT8_ASYMM
F, I, I64, B = np.float32, np.int32, np.int64, np.bool_
BIG = 2**31 - 1
RANKS = [5, 6, 8, 9, 12, 16, 33, 40, 64, 65, 100]  # (9: past TFLite's broadcasting kernels)


# ---- HAL models ------------------------------------------------------------------------------


def unary(op, tin=F32, tout=F32, qin=False, qout=False):
    def make(b, x, r):
        o = b.output(tout, [], 0.5 if qout else 0.0)
        b.operation(op, [x], [o])
    return make, tin, (0.5 if qin else 0.0)

def binary(op, tout=F32, act=True, tin=F32, other=None):
    def make(b, x, r):
        y = b.input(tin, other(r) if other else [1] * r)
        ins = [x, y] + ([b.scalar(T.INT32, 0)] if act else [])
        o = b.output(tout, [])
        b.operation(op, ins, [o])
    return make, tin, 0.0

def withconst(op, fn, tin=F32, tout=F32):
    def make(b, x, r):
        ins = [x] + fn(b, r)
        o = b.output(tout, [])
        b.operation(op, ins, [o])
    return make, tin, 0.0

ci = lambda v: (lambda b, r: [b.constant(I32, np.asarray(v(r), np.int32))])
sc = lambda v: (lambda b, r: [b.scalar(T.INT32, v(r))])

HAL_CASES = {
  "RESHAPE_same": withconst(O.RESHAPE, ci(lambda r: [-1])),
  "RESHAPE_r70": withconst(O.RESHAPE, ci(lambda r: [1] * 70)),
  "RESHAPE_r33": withconst(O.RESHAPE, ci(lambda r: [1] * 33)),
  "RESHAPE_big": withconst(O.RESHAPE, ci(lambda r: [BIG, BIG, BIG])),
  "CAST": unary(O.CAST, F32, I32),
  "DEQUANTIZE": unary(O.DEQUANTIZE, Q8, F32, qin=True),
  "QUANTIZE": unary(O.QUANTIZE, F32, Q8, qout=True),
  "ABS": unary(O.ABS), "EXP": unary(O.EXP), "NEG": unary(O.NEG), "FLOOR": unary(O.FLOOR),
  "RELU": unary(O.RELU), "LOGISTIC": unary(O.LOGISTIC), "HARD_SWISH": unary(O.HARD_SWISH),
  "LOGICAL_NOT": unary(O.LOGICAL_NOT, BOOL, BOOL),
  "ADD": binary(O.ADD), "MUL": binary(O.MUL), "MAXIMUM": binary(O.MAXIMUM, act=False),
  "POW": binary(O.POW, act=False),
  "EQUAL": binary(O.EQUAL, BOOL, act=False), "LESS": binary(O.LESS, BOOL, act=False),
  "LOGICAL_AND": binary(O.LOGICAL_AND, BOOL, act=False, tin=BOOL),
  "PRELU": binary(O.PRELU, act=False),
  "PAD": withconst(O.PAD, ci(lambda r: [[1, 1]] * r)),
  "PAD_big": withconst(O.PAD, ci(lambda r: [[BIG, BIG]] * r)),
  "MIRROR_PAD": withconst(O.MIRROR_PAD, lambda b, r: ci(lambda r: [[0, 0]] * r)(b, r) + [b.scalar(T.INT32, 0)]),
  "SLICE": withconst(O.SLICE, lambda b, r: ci(lambda r: [0] * r)(b, r) + ci(lambda r: [-1] * r)(b, r)),
  "STRIDED_SLICE": withconst(O.STRIDED_SLICE, lambda b, r: ci(lambda r: [0] * r)(b, r) + ci(lambda r: [1] * r)(b, r) + ci(lambda r: [1] * r)(b, r) + [b.scalar(T.INT32, -1), b.scalar(T.INT32, -1), b.scalar(T.INT32, 0)]),
  "GATHER": withconst(O.GATHER, lambda b, r: [b.scalar(T.INT32, 0), b.constant(I32, np.zeros([1] * min(r, 60), np.int32))]),
  "CONCAT": (lambda b, x, r: (lambda y, o: b.operation(O.CONCATENATION, [x, y, b.scalar(T.INT32, 0)], [o]))(b.input(F32, [1] * r), b.output(F32, [])), F32, 0.0),
  "EXPAND_DIMS": withconst(O.EXPAND_DIMS, sc(lambda r: 0)),
  "SQUEEZE": withconst(O.SQUEEZE, ci(lambda r: list(range(r)))),
  "SQUEEZE_none": withconst(O.SQUEEZE, lambda b, r: []),
  "TILE": withconst(O.TILE, ci(lambda r: [2] * r)),
  "TILE_big": withconst(O.TILE, ci(lambda r: [BIG] * r)),
  "TRANSPOSE": withconst(O.TRANSPOSE, ci(lambda r: list(range(r))[::-1])),
  "SELECT": (lambda b, x, r: (lambda c, y, o: b.operation(O.SELECT, [c, x, y], [o]))(b.input(BOOL, [1] * r), b.input(F32, [1] * r), b.output(F32, [])), F32, 0.0),
  "REVERSE": withconst(O.REVERSE, ci(lambda r: [0])),
  "BATCH_MATMUL": (lambda b, x, r: (lambda y, o: b.operation(O.BATCH_MATMUL, [x, y, b.scalar(T.BOOL, False), b.scalar(T.BOOL, False)], [o]))(b.input(F32, [1] * r), b.output(F32, [])), F32, 0.0),
  "REDUCE_SUM": withconst(O.REDUCE_SUM, lambda b, r: ci(lambda r: [0])(b, r) + [b.scalar(T.BOOL, True)]),
  "MEAN": withconst(O.MEAN, lambda b, r: ci(lambda r: list(range(r)))(b, r) + [b.scalar(T.INT32, 0)]),
  "ARGMAX": withconst(O.ARGMAX, sc(lambda r: 0), tout=I32),
  "SOFTMAX": withconst(O.SOFTMAX, lambda b, r: [b.scalar(T.FLOAT32, 1.0)]),
  "SPLIT": withconst(O.SPLIT, lambda b, r: [b.scalar(T.INT32, 0), b.scalar(T.INT32, 1)]),
  "CHANNEL_SHUFFLE": withconst(O.CHANNEL_SHUFFLE, lambda b, r: [b.scalar(T.INT32, 1), b.scalar(T.INT32, -1)]),
  "TOPK_V2": (lambda b, x, r: b.operation(O.TOPK_V2, [x, b.scalar(T.INT32, 1)], [b.output(F32, []), b.output(I32, [])]), F32, 0.0),
  "RANK": (lambda b, x, r: b.operation(O.RANK, [x], [b.output(T.INT32, [])]), F32, 0.0),
  "PACK": (lambda b, x, r: b.operation(O.PACK, [b.scalar(T.INT32, 0), x], [b.output(F32, [])]), F32, 0.0),
  "FILL": (lambda b, x, r: b.operation(O.FILL, [b.constant(I32, np.asarray([1] * r, np.int32)), b.scalar(T.FLOAT32, 1.0)], [b.output(F32, [])]), F32, 0.0),
  "L2_NORM": withconst(O.L2_NORMALIZATION, lambda b, r: []),
  "LOG_SOFTMAX": withconst(O.LOG_SOFTMAX, lambda b, r: [b.scalar(T.FLOAT32, 1.0), b.scalar(T.INT32, -1)]),
}


def hal_shapes(r: int):
    yield "ones", [1] * r
    yield "twos", [2] * r
    yield "zero", [0] + [1] * (r - 1)
    yield "big", [BIG] + [1] * (r - 1)
    yield "bigbig", [BIG] * min(r, 3) + [1] * (r - min(r, 3))


# ---- .tflite files ---------------------------------------------------------------------------


def io(g, shape, dt=F, sig=None):
    return g.input(shape, dt, signature=sig)

def case_unary(op, opts=None, dtin=F, dtout=F):
    def f(g, shape, sig):
        x = io(g, shape, dtin, sig); y = g.tensor(shape, dtout, signature=sig)
        g.op(op, [x], [y], opts); g.output(y)
    return f

def case_const(op, consts, outshape=None, opts=None, dtout=F, dtin=F):
    def f(g, shape, sig):
        x = io(g, shape, dtin, sig)
        cs = [g.const(np.asarray(c(len(shape), shape), dtype=d)) for c, d in consts]
        o = outshape(shape) if outshape else shape
        y = g.tensor(o, dtout); g.op(op, [x, *cs], [y], opts); g.output(y)
    return f

def case_fold(op, consts, outshape, opts=None, dtout=F):
    """All inputs constant: the importer folds."""
    def f(g, shape, sig):
        x = g.input([1], F)
        cs = [g.const(np.asarray(c(len(shape), shape), dtype=d)) for c, d in consts]
        y = g.tensor(outshape(shape), dtout); g.op(op, cs, [y], opts)
        z = g.tensor([1], F); g.op("ADD", [x, x], [z], ("AddOptions", dict(FusedActivationFunction=0)))
        g.output(y, z)
    return f

def case_binary(op, opts=None, dtout=F, other=None):
    def f(g, shape, sig):
        x = io(g, shape, F, sig); c = g.const(np.ones(other(shape) if other else [1] * len(shape), F))
        y = g.tensor(shape, dtout, signature=sig); g.op(op, [x, c], [y], opts); g.output(y)
    return f

ADDO = ("AddOptions", dict(FusedActivationFunction=0))
TFLITE_CASES = {
 "RESHAPE_r70": case_const("RESHAPE", [(lambda r, s: [1] * 70, I)], lambda s: [1] * 70),
 "RESHAPE_big": case_const("RESHAPE", [(lambda r, s: [BIG, BIG, BIG], I)], lambda s: [BIG, BIG, BIG]),
 "RESHAPE_neg": case_const("RESHAPE", [(lambda r, s: [-1, BIG], I)], lambda s: [-1, BIG]),
 "RESHAPE_opt70": lambda g, s, sig: (lambda x, y: (g.op("RESHAPE", [x], [y], ("ReshapeOptions", dict(NewShape=[1] * 70))), g.output(y)))(io(g, s, F, sig), g.tensor([1] * 70, F)),
 "TILE_2^40": case_const("TILE", [(lambda r, s: [2**40] + [1] * (r - 1), I64)], lambda s: [1] * len(s)),
 "TILE_big": case_const("TILE", [(lambda r, s: [BIG] * r, I)], lambda s: [BIG] * len(s)),
 "TILE_fold": case_fold("TILE", [(lambda r, s: np.ones(s, F), F), (lambda r, s: [2**20] * r, I)], lambda s: [2**20] * len(s)),
 "BROADCAST_TO_r70": case_const("BROADCAST_TO", [(lambda r, s: [1] * 70, I)], lambda s: [1] * 70),
 "BROADCAST_TO_big": case_const("BROADCAST_TO", [(lambda r, s: [BIG] * r, I)], lambda s: [BIG] * len(s)),
 "BROADCAST_TO_fold": case_fold("BROADCAST_TO", [(lambda r, s: np.ones([1] * r, F), F), (lambda r, s: [BIG] * r, I)], lambda s: [BIG] * len(s)),
 "FILL_fold_big": case_fold("FILL", [(lambda r, s: [BIG] * r, I), (lambda r, s: 1.0, F)], lambda s: [BIG] * len(s)),
 "FILL_fold_r70": case_fold("FILL", [(lambda r, s: [1] * 70, I), (lambda r, s: 1.0, F)], lambda s: [1] * 70),
 "ZEROS_fold": case_fold("ADD", [(lambda r, s: np.ones([1] * r, F), F), (lambda r, s: np.ones([1] * r, F), F)], lambda s: [1] * len(s), ADDO),
 "EXPAND_DIMS": case_const("EXPAND_DIMS", [(lambda r, s: 0, I)], lambda s: [1, *s]),
 "SQUEEZE": case_unary("SQUEEZE", ("SqueezeOptions", dict(SqueezeDims=[]))),
 "TRANSPOSE": case_const("TRANSPOSE", [(lambda r, s: list(range(r))[::-1], I)], lambda s: s[::-1]),
 "PAD": case_const("PAD", [(lambda r, s: [[1, 1]] * r, I)], lambda s: [d + 2 for d in s]),
 "PAD_big": case_const("PAD", [(lambda r, s: [[BIG, BIG]] * r, I)], lambda s: [d for d in s]),
 "SLICE": case_const("SLICE", [(lambda r, s: [0] * r, I), (lambda r, s: [-1] * r, I)]),
 "STRIDED_SLICE": case_const("STRIDED_SLICE", [(lambda r, s: [0] * r, I), (lambda r, s: [BIG] * r, I), (lambda r, s: [1] * r, I)], opts=("StridedSliceOptions", {})),
 "GATHER": case_const("GATHER", [(lambda r, s: np.zeros([1] * min(r, 60)), I)], lambda s: [1] * (len(s) - 1 + min(len(s), 60)), ("GatherOptions", dict(Axis=0))),
 "CONCAT": case_binary("CONCATENATION", ("ConcatenationOptions", dict(Axis=0)), other=lambda s: s),
 "CAST": case_unary("CAST", None, F, I),
 "ADD": case_binary("ADD", ADDO),
 "ADD_bcast": case_binary("ADD", ADDO, other=lambda s: [2] + [1] * (len(s) - 1)),
 "MUL": case_binary("MUL", ("MulOptions", dict(FusedActivationFunction=0))),
 "LESS": case_binary("LESS", None, B),
 "MAXIMUM": case_binary("MAXIMUM"),
 "SELECT_V2": lambda g, s, sig: (lambda c, x, y: (g.op("SELECT_V2", [c, x, x], [y]), g.output(y)))(g.const(np.ones([1] * len(s), B)), io(g, s, F, sig), g.tensor(s, F)),
 "REVERSE_V2": case_const("REVERSE_V2", [(lambda r, s: [0], I)]),
 "SHAPE": case_unary("SHAPE", None, F, I),
 "RANK": case_unary("RANK", None, F, I),
 "PACK": lambda g, s, sig: (lambda x, y: (g.op("PACK", [x, x], [y], ("PackOptions", dict(ValuesCount=2, Axis=0))), g.output(y)))(io(g, s, F, sig), g.tensor([2, *s], F)),
 "UNPACK": lambda g, s, sig: (lambda x, y: (g.op("UNPACK", [x], [y], ("UnpackOptions", dict(Num=1, Axis=0))), g.output(y)))(io(g, s, F, sig), g.tensor(s[1:], F)),
 "SUM": case_const("SUM", [(lambda r, s: [0], I)], lambda s: s[1:], ("ReducerOptions", dict(KeepDims=False))),
 "MEAN": case_const("MEAN", [(lambda r, s: list(range(len(s))), I)], lambda s: [], ("ReducerOptions", dict(KeepDims=False))),
 "BATCH_MATMUL": case_binary("BATCH_MATMUL", ("BatchMatMulOptions", dict(AdjX=False, AdjY=False))),
 "SOFTMAX": case_unary("SOFTMAX", ("SoftmaxOptions", dict(Beta=1.0))),
 "LOGISTIC": case_unary("LOGISTIC"),
 "ZEROS_LIKE": case_unary("ZEROS_LIKE"),
 "ARG_MAX": case_const("ARG_MAX", [(lambda r, s: [0], I)], lambda s: s[1:], ("ArgMaxOptions", dict(OutputType=2)), I),
 "GATHER_ND": case_const("GATHER_ND", [(lambda r, s: np.zeros([1, r]), I)], lambda s: [1]),
 "SPLIT": lambda g, s, sig: (lambda a, x, y: (g.op("SPLIT", [a, x], [y], ("SplitOptions", dict(NumSplits=1))), g.output(y)))(g.const(np.asarray(0, I)), io(g, s, F, sig), g.tensor(s, F)),
 "SCATTER_ND": lambda g, s, sig: (lambda i, u, sh, y: (g.op("SCATTER_ND", [i, u, sh], [y]), g.output(y)))(g.const(np.zeros([1, len(s)], I)), io(g, [1], F), g.const(np.asarray(s, I)), g.tensor(s, F)),
 "ONE_HOT": lambda g, s, sig: (lambda i, y: (g.op("ONE_HOT", [i, g.const(np.asarray(BIG, I)), g.const(np.asarray(1, F)), g.const(np.asarray(0, F))], [y], ("OneHotOptions", dict(Axis=-1))), g.output(y)))(io(g, s, I, sig), g.tensor([*s, BIG], F)),
}


def tflite_shapes(r: int):
    for kind, shape in hal_shapes(r):
        yield kind, shape, None
    yield "dyn", [1] * r, [-1] * r


# ---- the sweep -------------------------------------------------------------------------------

class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout()


def _small(shape: list[int], r: int) -> bool:
    return r <= 64 and np.prod(np.asarray(shape, dtype=object)) <= 4096


def _feeds(s: Session) -> list[np.ndarray]:
    return [np.zeros([1 if d in (None, -1) else d for d in i.shape], i.dtype) for i in s.inputs]


def _attempt(bugs: dict, what: tuple, stage: str, fn) -> bool:
    """Runs one stage; False when it refused (or failed) and later stages are moot."""
    signal.alarm(10)
    t0 = time.time()
    try:
        fn()
        return True
    except OK:
        return False
    except _Timeout:
        print("BUG", *what, stage, "TIMEOUT", flush=True)
        return False
    except Exception as e:  # noqa: BLE001 - what the sweep looks for
        key = (what[0], stage, type(e).__name__)
        if key not in bugs:
            bugs[key] = what
            tb = traceback.extract_tb(e.__traceback__)[-1]
            print("BUG", *what, stage, type(e).__name__, str(e)[:120],
                  f"{tb.filename}:{tb.lineno}", flush=True)
        return False
    finally:
        signal.alarm(0)
        if time.time() - t0 > 3:
            print("SLOW", *what, stage, round(time.time() - t0, 1), flush=True)


def hal_models(only, ranks):
    """(what, model, dims, rank) of every HAL case the builder accepts."""
    for name, (make, tin, qin) in HAL_CASES.items():
        if only and name not in only:
            continue
        for r in ranks:
            for kind, dims in hal_shapes(r):
                b = ModelBuilder()
                try:
                    make(b, b.input(tin, dims, qin, 0), r)
                    yield (name, r, kind), b.build(), dims, r
                except OK:
                    continue


def _on_device(bugs: dict, what: tuple, stage: str, model, device, dims, r) -> None:
    """A Session of ``model`` on ``device`` (a name, an IDevice, None: the runtime), run when
    its shapes are small."""
    def run() -> None:
        with Session(model, device) as s:
            if _small(dims, r):
                s.run(_feeds(s))
    _attempt(bugs, what, stage, run)


def sweep_hal(only, ranks, bugs: dict) -> int:
    n = 0
    for what, model, dims, r in hal_models(only, ranks):
        n += 1
        if not _attempt(bugs, what, "analyse", lambda: analyse(model)):
            continue
        for device in ("reference", None):
            _on_device(bugs, what, f"session:{device}", model, device, dims, r)
    return n


def _constant_bytes(model, o) -> bytes:
    """An operand's constant as the C client hands it (CONSTANT_COPY / _REFERENCE)."""
    loc = o.location
    if o.lifetime == L.CONSTANT_COPY:
        return bytes(model.operand_values[loc.offset:loc.offset + loc.length])
    return model.pools[loc.pool_index].read(loc.offset, loc.length)


def replay_capi(model) -> list[tuple[str, int]]:
    """``model`` (main subgraph only) through libneuralnetworks.so, as a C client builds,
    compiles and runs it: the NDK calls made and the code each answered, up to the first
    that failed. Inputs and outputs get buffers when small; large ones are not run."""
    from nnhal.capi import ctypes_ndk as N
    from nnhal.runtime.model import ANeuralNetworksOperandType as OT

    calls: list[tuple[str, int]] = []

    def call(what: str, code: int) -> bool:
        calls.append((what, int(code)))
        return code == 0

    main = model.main
    code, m = N.ANeuralNetworksModel_create()
    if not call("Model_create", code):
        return calls
    try:
        for i, o in enumerate(main.operands):
            if not call(f"addOperand {i}", N.ANeuralNetworksModel_addOperand(
                    m, OT(int(o.type), list(o.dimensions), float(o.scale), int(o.zero_point)))):
                return calls
            if o.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
                blob = _constant_bytes(model, o)
                if not call(f"setOperandValue {i}", N.ANeuralNetworksModel_setOperandValue(
                        m, i, blob, len(blob))):
                    return calls
            elif o.lifetime == L.NO_VALUE:
                if not call(f"setOperandValue {i}",
                            N.ANeuralNetworksModel_setOperandValue(m, i, None, 0)):
                    return calls
        for op in main.operations:
            if not call(f"addOperation {O(op.type).name}", N.ANeuralNetworksModel_addOperation(
                    m, int(op.type), list(op.inputs), list(op.outputs))):
                return calls
        if not (call("identifyInputsAndOutputs", N.ANeuralNetworksModel_identifyInputsAndOutputs(
                m, list(main.input_indexes), list(main.output_indexes)))
                and call("Model_finish", N.ANeuralNetworksModel_finish(m))):
            return calls
        code, c = N.ANeuralNetworksCompilation_create(m)
        if not call("Compilation_create", code):
            return calls
        try:
            if not call("Compilation_finish", N.ANeuralNetworksCompilation_finish(c)):
                return calls
            code, e = N.ANeuralNetworksExecution_create(c)
            if not call("Execution_create", code):
                return calls
            try:
                for k, i in enumerate(main.input_indexes):
                    o = main.operands[i]
                    n = int(np.prod(np.asarray(o.dimensions, dtype=object)))
                    if not 0 < n <= 4096:
                        return calls  # (built and compiled: a run of it is not the point)
                    buf = bytes(n * 4)
                    if not call(f"setInput {k}", N.ANeuralNetworksExecution_setInput(
                            e, k, None, buf, len(buf))):
                        return calls
                for k in range(len(main.output_indexes)):
                    buf = np.zeros(1 << 16, np.uint8)
                    if not call(f"setOutput {k}", N.ANeuralNetworksExecution_setOutput(
                            e, k, None, buf, buf.nbytes)):
                        return calls
                call("Execution_compute", N.ANeuralNetworksExecution_compute(e))
            finally:
                N.ANeuralNetworksExecution_free(e)
        finally:
            N.ANeuralNetworksCompilation_free(c)
    finally:
        N.ANeuralNetworksModel_free(m)
    return calls


def sweep_capi(only, ranks, bugs: dict) -> int:
    """The HAL cases through the C library: every call must answer one of the NDK's codes
    (a crash ends the sweep, a hang is a TIMEOUT, an exception a BUG)."""
    from nnhal.runtime.codes import ResultCode

    codes = {int(c) for c in ResultCode}
    n = 0
    for what, model, _dims, _r in hal_models(only, ranks):
        n += 1

        def run() -> None:
            bad = [c for c in replay_capi(model) if c[1] not in codes]
            if bad:
                raise AssertionError(f"undefined NDK code {bad[0]}")

        _attempt(bugs, what, "capi", run)
    return n


def sweep_service(only, ranks, bugs: dict) -> int:
    """The HAL cases through a served reference driver (a service on a socket, in a thread
    here): the model, its pools and requests across the wire (Session(model, remote))."""
    import tempfile
    import threading

    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.service.client import RemoteDevice
    from nnhal.service.server import Service

    n = 0
    with tempfile.TemporaryDirectory() as d:
        svc = Service(ReferenceDevice(), os.path.join(d, "s.sock"))
        t = threading.Thread(target=svc.serve_forever, daemon=True)
        t.start()
        remote = RemoteDevice(svc.path)
        try:
            for what, model, dims, r in hal_models(only, ranks):
                n += 1
                _on_device(bugs, what, "service", model, remote, dims, r)
        finally:
            remote.close()
            svc.stop()
            t.join(5)
            svc.device.close()
    return n


def sweep_aidl(only, ranks, bugs: dict) -> int:
    """The HAL cases through the AIDL face of the reference driver (nnhal.aidl.through_aidl:
    the model converted to the AIDL types and back, as an AIDL client hands it over)."""
    from nnhal.aidl import through_aidl
    from nnhal.drivers.reference import ReferenceDevice

    device = through_aidl(ReferenceDevice())
    n = 0
    for what, model, dims, r in hal_models(only, ranks):
        n += 1
        _on_device(bugs, what, "aidl", model, device, dims, r)
    return n


def sweep_tflite(only, ranks, bugs: dict) -> int:
    n = 0
    for name, make in TFLITE_CASES.items():
        if only and name not in only:
            continue
        for r in ranks:
            for kind, shape, sig in tflite_shapes(r):
                what = (name, r, kind)
                g = Graph()
                try:
                    make(g, shape, sig)
                    data = build(g)
                except Exception:  # noqa: BLE001 - a file the writer cannot make (rank > 64)
                    continue
                n += 1
                if not _attempt(bugs, what, "read", lambda: read_tflite(data)):
                    continue
                holder: list[Session] = []
                if not _attempt(bugs, what, "session", lambda: holder.append(Session(data))):
                    continue
                if _small(shape, r):
                    _attempt(bugs, what, "run", lambda: holder[0].run(_feeds(holder[0])))
    return n


def main() -> None:
    faulthandler.enable()
    resource.setrlimit(resource.RLIMIT_AS, (5 << 30, 5 << 30))
    signal.signal(signal.SIGALRM, _alarm)
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    only = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] != "all" else None
    ranks = [int(a) for a in sys.argv[3].split(",")] if len(sys.argv) > 3 else RANKS
    bugs: dict = {}
    t0 = time.time()
    n = 0
    if which in ("hal", "all"):
        n += sweep_hal(only, ranks, bugs)
    if which in ("tflite", "all"):
        n += sweep_tflite(only, ranks, bugs)
    if which in ("capi", "all"):
        n += sweep_capi(only, ranks, bugs)
    if which in ("service", "all"):
        n += sweep_service(only, ranks, bugs)
    if which in ("aidl", "all"):
        n += sweep_aidl(only, ranks, bugs)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{n} models, {len(bugs)} bugs, {time.time() - t0:.0f} s (load {' '.join(load)})")


if __name__ == "__main__":
    main()
