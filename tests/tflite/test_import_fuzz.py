"""Mutants of small real .tflite files (a wake-word detector of the test extra, hand-made
float, per-channel int8 and control-flow models): random byte flips and field-level
mutations of shapes, indices, opcodes, quantization arrays, buffers and input lists. nnhal's
reader must accept each or refuse it with its one-line error, never another exception nor a
hang; and a mutant nnhal accepts must be one ai-edge-litert accepts too (its Interpreter in
a child process, since a bad file can crash it)."""

from __future__ import annotations

import signal
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import tflite
from oracle import available, verdicts
from tfl import Graph, Quant, build

from nnhal.errors import ModelFileError, UnsupportedModelError
from nnhal.tflite import read_tflite

F = np.float32
#: Mutants per seed model, and the seed of the generator.
PER_MODEL, SEED = 1000, 20241126
#: A hang is a mutant whose reading takes longer than this.
HANG_S = 5


def _conv_model() -> bytes:
    g = Graph()
    x = g.input((1, 4, 4, 2), F, name="x")
    w = g.const(np.arange(24, dtype=F).reshape(3, 2, 2, 2) / 24)
    b = g.const(np.float32([0.5, -0.5, 0]))
    y = g.tensor((1, 3, 3, 3), F)
    g.op("CONV_2D", [x, w, b], [y], ("Conv2DOptions", dict(Padding=1, StrideW=1, StrideH=1)))
    z = g.tensor((1, 27), F, name="z")
    g.op("RESHAPE", [y, g.const(np.int32([1, 27]))], [z])
    s = g.tensor((1, 27), F, name="s")
    g.op("SOFTMAX", [z], [s], ("SoftmaxOptions", dict(Beta=1.0)))
    g.output(s)
    return build(g)


def _int8_model() -> bytes:
    g = Graph()
    x = g.input((1, 3, 3, 2), np.int8, name="x", quant=Quant([0.05], [-3]))
    w = g.const(np.arange(-8, 8, dtype=np.int8).reshape(2, 2, 2, 2),
                quant=Quant([0.01, 0.02], [0, 0], 0))
    b = g.const(np.int32([10, -10]), quant=Quant([0.0005, 0.001], [0, 0], 0))
    y = g.tensor((1, 2, 2, 2), np.int8, name="y", quant=Quant([0.1], [2]))
    g.op("CONV_2D", [x, w, b], [y], ("Conv2DOptions", dict(Padding=1, StrideW=1, StrideH=1,
                                                            FusedActivationFunction=1)))
    z = g.tensor((1, 2, 2, 2), np.int8, name="z", quant=Quant([0.1], [2]))
    g.op("ADD", [y, y], [z], ("AddOptions", dict(FusedActivationFunction=0)))
    g.output(z)
    return build(g)


def _if_model() -> bytes:
    def branch(op: str) -> Graph:
        sub = Graph()
        a = sub.input((2,), F)
        c = sub.tensor((2,), F)
        sub.op(op, [a, sub.const(np.float32([2, 2]))], [c],
               (f"{op.capitalize()}Options", dict(FusedActivationFunction=0)))
        sub.output(c)
        return sub

    g = Graph()
    c = g.input((1,), np.bool_, name="cond")
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("IF", [c, x], [y], ("IfOptions", dict(ThenSubgraphIndex=1, ElseSubgraphIndex=2)))
    g.output(y)
    return build(g, branch("ADD"), branch("MUL"))


#: Converter-made models of the shape inference below placeholders and the complex64 family
#: (BirdNET's front end in small), mutated fewer times each (their mutants found type and
#: count agreements TFLite's Prepare checks that nnhal's folding skipped).
CONVERTER_SEEDS, PER_CONVERTER_SEED = ("stft_net", "complex_movement"), 300


def _seeds() -> dict[str, bytes]:
    seeds = {"conv": _conv_model(), "int8": _int8_model(), "if": _if_model()}
    data = Path(__file__).resolve().parent / "data"
    for name in CONVERTER_SEEDS:
        seeds[name] = (data / f"{name}.tflite").read_bytes()
    try:
        import importlib.resources as resources
        path = resources.files("pymicro_wakeword") / "models/hey_jarvis.tflite"
        seeds["hey_jarvis"] = path.read_bytes()
    except (ImportError, FileNotFoundError):
        pass
    return seeds


# ---- where the fields are --------------------------------------------------------------------

#: (byte position, struct format) of a field a mutation may rewrite.
Site = tuple[int, str]


def _field(table: object, k: int) -> int:
    off = table._tab.Offset(4 + 2 * k)
    return table._tab.Pos + off if off else 0


def _vector(data: bytes, pos: int, fmt: str, sites: list[Site]) -> None:
    """The length word of the vector field at ``pos`` and its elements."""
    if not pos:
        return
    start = pos + struct.unpack_from("<I", data, pos)[0]
    n = struct.unpack_from("<I", data, start)[0]
    sites.append((start, "<I"))
    size = struct.calcsize(fmt)
    sites.extend((start + 4 + size * k, fmt) for k in range(min(n, 64)))


def _sites(data: bytes) -> list[Site]:
    """Every scalar field and vector of the schema that the reader's rules are about."""
    model = tflite.Model.GetRootAs(data)
    sites: list[Site] = []
    for k in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(k)
        sites += [(p, f) for p, f in ((_field(oc, 0), "<b"), (_field(oc, 3), "<i")) if p]
    for k in range(model.BuffersLength()):
        buf = model.Buffers(k)
        _vector(data, _field(buf, 0), "<B", sites)
    for s in range(model.SubgraphsLength()):
        sg = model.Subgraphs(s)
        _vector(data, _field(sg, 1), "<i", sites)
        _vector(data, _field(sg, 2), "<i", sites)
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            _vector(data, _field(t, 0), "<i", sites)
            _vector(data, _field(t, 7), "<i", sites)
            sites += [(p, f) for p, f in ((_field(t, 1), "<b"), (_field(t, 2), "<I")) if p]
            q = t.Quantization()
            if q is not None:
                _vector(data, _field(q, 2), "<f", sites)
                _vector(data, _field(q, 3), "<q", sites)
                if _field(q, 6):
                    sites.append((_field(q, 6), "<i"))
        for k in range(sg.OperatorsLength()):
            op = sg.Operators(k)
            if _field(op, 0):
                sites.append((_field(op, 0), "<I"))
            _vector(data, _field(op, 1), "<i", sites)
            _vector(data, _field(op, 2), "<i", sites)
            opts = op.BuiltinOptions()
            if opts is not None:  # the first int fields of the options (axes, subgraphs)
                vt = opts.Pos - struct.unpack_from("<i", data, opts.Pos)[0]
                n = (struct.unpack_from("<H", data, vt)[0] - 4) // 2
                for f in range(min(n, 4)):
                    off = struct.unpack_from("<H", data, vt + 4 + 2 * f)[0]
                    if off:
                        sites.append((opts.Pos + off, "<b"))
    return sites


_INTERESTING = [-(1 << 31), -128, -2, -1, 0, 1, 2, 3, 4, 5, 18, 126, 127, 128, 255, 1000,
                100_000, (1 << 31) - 1]


def _mutant(data: bytes, sites: list[Site], rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    if rng.random() < 0.3:
        for k in rng.integers(0, len(b), rng.integers(1, 5)):
            b[k] = int(rng.integers(0, 256))
        return bytes(b)
    for _ in range(rng.integers(1, 3)):
        pos, fmt = sites[int(rng.integers(len(sites)))]
        if fmt == "<f":
            value: float = float(rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e-30]))
        else:
            old = struct.unpack_from(fmt, b, pos)[0]
            value = int(rng.choice(_INTERESTING + [old - 1, old + 1]))
            bits = 8 * struct.calcsize(fmt)
            lo, hi = (0, (1 << bits) - 1) if fmt[1].isupper() else (-(1 << (bits - 1)),
                                                                    (1 << (bits - 1)) - 1)
            value = min(max(value, lo), hi)
        struct.pack_into(fmt, b, pos, value)
    return bytes(b)


class _Hang(Exception):
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise _Hang


def test_mutants_are_read_or_refused_in_one_line_and_never_accepted_where_litert_refuses(
        ) -> None:
    rng = np.random.default_rng(SEED)
    outcomes = {"accepted": 0, "file": 0, "unsupported": 0}
    accepted: list[tuple[str, bytes]] = []
    foreign: list[str] = []
    slowest = 0.0
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for name, data in _seeds().items():
            read_tflite(data)  # the seed itself is a good model
            sites = _sites(data)
            for _ in range(PER_CONVERTER_SEED if name in CONVERTER_SEEDS else PER_MODEL):
                m = _mutant(data, sites, rng)
                start = time.monotonic()
                signal.alarm(HANG_S)
                try:
                    read_tflite(m, name="m.tflite")
                    outcomes["accepted"] += 1
                    if m != data:
                        accepted.append((name, m))
                except ModelFileError as e:
                    assert str(e).startswith("m.tflite: ") and "\n" not in str(e)
                    outcomes["file"] += 1
                except UnsupportedModelError as e:
                    assert "\n" not in str(e)
                    outcomes["unsupported"] += 1
                except _Hang:
                    foreign.append(f"{name}: hang")
                except Exception as e:  # noqa: BLE001  (what the test is looking for)
                    foreign.append(f"{name}: {type(e).__name__}: {e}")
                finally:
                    signal.alarm(0)
                slowest = max(slowest, time.monotonic() - start)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert foreign == []
    assert outcomes["file"] > 0 and outcomes["accepted"] > 0
    if not available():
        pytest.skip("ai-edge-litert is not installed: mutants were not checked against it")
    said = verdicts([m for _, m in accepted], budget_s=120)
    # No exemptions: a mutant nnhal reads must be one litert constructs and allocates. A
    # litert crash counts as a refusal too: the one class seen (a quantized ADD's output
    # scale rewritten to 8e-29) is TFLite's own rule, asserted with a TFLITE_CHECK in its
    # kernel's Prepare, which nnhal now refuses; a crash that is litert's bug alone would
    # show here as a failure naming the file, to be examined rather than copied.
    wrong = [f"{name}: {v}" for (name, _), v in zip(accepted, said) if v != "ok"]
    assert wrong == [], f"{len(wrong)} of {len(accepted)} accepted mutants litert refuses: {wrong}"
