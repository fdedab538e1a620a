"""HAL models for the benchmarks, built with :class:`~nnhal.hal.builder.ModelBuilder`.

:func:`mobilenet_v2_float` is MobileNetV2 at 224x224 (width 1.0) in float32: a 3x3 stride-2
convolution to 32 channels, 17 inverted-residual blocks (1x1 expansion + RELU6, 3x3 depthwise
+ RELU6, 1x1 linear projection, and an ADD of the block's input when the stride is 1 and the
channel count does not change), a 1x1 convolution to 1280 channels + RELU6, a 7x7 average pool,
a fully connected layer to 1000 classes and SOFTMAX. Weights are random (fixed seed), scaled
like He initialisation so that activations stay of order one all the way down.

:func:`mobilenet_v2_int8` is the same network, full-integer: int8 activations
(TENSOR_QUANT8_ASYMM_SIGNED), per-channel int8 filters (TENSOR_QUANT8_SYMM_PER_CHANNEL), int32
biases. Each activation's scale and zero point come from a calibration: one float run of the
same weights through the reference driver, with every activation made a model output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import (
    Model,
    OperandLifeTime,
    OperandType,
    OperationType,
    SymmPerChannelQuantParams,
)

F32 = OperandType.TENSOR_FLOAT32
I8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
PER_CHANNEL = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
I32 = OperandType.TENSOR_INT32
SAME, NONE, RELU6 = 1, 0, 3  # implicit padding SAME; fused activation codes

#: (expansion t, output channels c, repeats n, first stride s) of MobileNetV2's 17 blocks.
BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))
SIZE = 224
CLASSES = 1000
#: Softmax output quantization fixed by NNAPI and TFLite for int8.
SOFTMAX_SCALE, SOFTMAX_ZP = 1.0 / 256.0, -128


@dataclass
class Layer:
    """One operation of the network over numbered activations (0 is the model input)."""

    kind: str  # conv | dw | add | pool | fc | softmax
    src: tuple[int, ...]
    dst: int
    shape: tuple[int, ...]  # the output activation's shape (NHWC)
    weights: np.ndarray | None = None
    bias: np.ndarray | None = None
    stride: int = 1
    act: int = NONE


def mobilenet_v2_layers(seed: int = 0, size: int = SIZE) -> list[Layer]:
    """The layers of MobileNetV2 with random weights from ``seed``."""
    rng = np.random.default_rng(seed)
    layers: list[Layer] = []
    shapes: list[tuple[int, ...]] = [(1, size, size, 3)]

    def new(shape: tuple[int, ...]) -> int:
        shapes.append(shape)
        return len(shapes) - 1

    def conv(src: int, out_c: int, k: int, stride: int, act: int) -> int:
        _, h, w, in_c = shapes[src]
        gain = 2.0 if act == RELU6 else 1.0
        wts = rng.normal(0.0, np.sqrt(gain / (k * k * in_c)), (out_c, k, k, in_c))
        bias = rng.normal(0.0, 0.1, out_c)
        shape = (1, -(-h // stride), -(-w // stride), out_c)
        dst = new(shape)
        layers.append(Layer("conv", (src,), dst, shape, wts.astype(np.float32),
                            bias.astype(np.float32), stride, act))
        return dst

    def depthwise(src: int, stride: int) -> int:
        _, h, w, c = shapes[src]
        wts = rng.normal(0.0, np.sqrt(2.0 / 9.0), (1, 3, 3, c))
        bias = rng.normal(0.0, 0.1, c)
        shape = (1, -(-h // stride), -(-w // stride), c)
        dst = new(shape)
        layers.append(Layer("dw", (src,), dst, shape, wts.astype(np.float32),
                            bias.astype(np.float32), stride, RELU6))
        return dst

    x = conv(0, 32, 3, 2, RELU6)
    for t, c, n, s in BLOCKS:
        for r in range(n):
            stride = s if r == 0 else 1
            in_c = shapes[x][3]
            y = conv(x, in_c * t, 1, 1, RELU6) if t != 1 else x
            y = depthwise(y, stride)
            y = conv(y, c, 1, 1, NONE)
            if stride == 1 and in_c == c:
                dst = new(shapes[y])
                layers.append(Layer("add", (x, y), dst, shapes[y]))
                y = dst
            x = y
    x = conv(x, 1280, 1, 1, RELU6)
    pooled = new((1, 1, 1, 1280))
    layers.append(Layer("pool", (x,), pooled, shapes[pooled], stride=shapes[x][1]))
    # Logits spread enough (std ~3) that the softmax is not flat.
    fc_w = rng.normal(0.0, 3.0 / np.sqrt(1280.0), (CLASSES, 1280))
    logits = new((1, CLASSES))
    layers.append(Layer("fc", (pooled,), logits, shapes[logits], fc_w.astype(np.float32),
                        rng.normal(0.0, 0.1, CLASSES).astype(np.float32)))
    probs = new((1, CLASSES))
    layers.append(Layer("softmax", (logits,), probs, shapes[probs]))
    return layers


Quant = dict[int, tuple[float, int]]  # activation -> (scale, zero point)


def build(layers: Sequence[Layer], quant: Quant | None = None, *, expose: bool = False,
          extra_outputs: Sequence[int] = ()) -> Model:
    """The HAL model of ``layers``: float32 without ``quant``, full-integer int8 with it.
    ``expose`` makes every activation a model output (in activation order, for calibration);
    otherwise the outputs are the last activation, then ``extra_outputs``."""
    b = ModelBuilder()
    quant = dict(quant) if quant is not None else None  # pool and softmax entries are set
    last = layers[-1].dst
    outputs = {last, *extra_outputs}
    ops: dict[int, int] = {}
    qp: dict[int, tuple[float, int]] = {}

    def activation(k: int, shape: Sequence[int]) -> int:
        scale, zp = quant[k] if quant is not None else (0.0, 0)
        qp[k] = (scale, zp)
        t = I8 if quant is not None else F32
        if expose or k in outputs:
            return b.operand(t, shape, scale, zp, lifetime=OperandLifeTime.SUBGRAPH_OUTPUT)
        return b.operand(t, shape, scale, zp)

    scalar = b.scalar
    ops[0] = b.input(I8 if quant is not None else F32, (1, SIZE, SIZE, 3),
                     *(quant[0] if quant is not None else (0.0, 0)))
    qp[0] = quant[0] if quant is not None else (0.0, 0)
    for layer in layers:
        src = [ops[s] for s in layer.src]
        if quant is not None and layer.kind == "pool":
            quant[layer.dst] = quant[layer.src[0]]  # TFLite's int8 pool keeps the scale
        if quant is not None and layer.kind == "softmax":
            quant[layer.dst] = (SOFTMAX_SCALE, SOFTMAX_ZP)
        dst = activation(layer.dst, layer.shape)
        ops[layer.dst] = dst
        in_scale = qp[layer.src[0]][0]
        if layer.kind in ("conv", "dw"):
            wts, bias = _filter(b, layer, quant is not None, in_scale)
            ins = [src[0], wts, bias, scalar(OperandType.INT32, SAME),
                   scalar(OperandType.INT32, layer.stride), scalar(OperandType.INT32, layer.stride)]
            if layer.kind == "dw":
                ins.append(scalar(OperandType.INT32, 1))
            ins.append(scalar(OperandType.INT32, layer.act))
            op = OperationType.CONV_2D if layer.kind == "conv" else OperationType.DEPTHWISE_CONV_2D
            b.operation(op, ins, [dst])
        elif layer.kind == "add":
            b.operation(OperationType.ADD, [*src, scalar(OperandType.INT32, NONE)], [dst])
        elif layer.kind == "pool":
            k = layer.stride
            b.operation(OperationType.AVERAGE_POOL_2D,
                        [src[0], *(scalar(OperandType.INT32, v) for v in (2, k, k, k, k, NONE))],
                        [dst])
        elif layer.kind == "fc":
            wts, bias = _fc_weights(b, layer, quant is not None, in_scale)
            b.operation(OperationType.FULLY_CONNECTED,
                        [src[0], wts, bias, scalar(OperandType.INT32, NONE)], [dst])
        elif layer.kind == "softmax":
            b.operation(OperationType.SOFTMAX, [src[0], scalar(OperandType.FLOAT32, 1.0)], [dst])
        else:
            raise ValueError(f"unknown layer kind {layer.kind}")
    if expose:
        b.outputs = [ops[k] for k in sorted(ops) if k != 0]
    else:
        b.outputs = [ops[last], *(ops[k] for k in extra_outputs)]
    return b.build()


def _filter(b: ModelBuilder, layer: Layer, quantized: bool, in_scale: float
            ) -> tuple[int, int]:
    w, bias = layer.weights, layer.bias
    assert w is not None and bias is not None
    if not quantized:
        return b.constant(F32, w), b.constant(F32, bias)
    axis = 0 if layer.kind == "conv" else 3
    other = tuple(a for a in range(4) if a != axis)
    scales = np.maximum(np.abs(w).max(axis=other), 1e-8) / 127.0
    shape = [1, 1, 1, 1]
    shape[axis] = -1
    q = np.clip(np.round(w / scales.reshape(shape)), -127, 127).astype(np.int8)
    qb = np.round(bias / (in_scale * scales)).astype(np.int32)
    params = SymmPerChannelQuantParams([float(s) for s in scales.astype(np.float32)], axis)
    return b.constant(PER_CHANNEL, q, channel_quant=params), b.constant(I32, qb)


def _fc_weights(b: ModelBuilder, layer: Layer, quantized: bool, in_scale: float
                ) -> tuple[int, int]:
    w, bias = layer.weights, layer.bias
    assert w is not None and bias is not None
    if not quantized:
        return b.constant(F32, w), b.constant(F32, bias)
    scale = float(np.float32(np.abs(w).max() / 127.0))
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    bias_scale = float(np.float32(in_scale) * np.float32(scale))
    qb = np.round(bias / bias_scale).astype(np.int32)
    return b.constant(I8, q, scale=scale, zero_point=0), b.constant(I32, qb, scale=bias_scale)


def mobilenet_v2_float(seed: int = 0) -> Model:
    """MobileNetV2 224 float32 with random weights (see the module's text)."""
    return build(mobilenet_v2_layers(seed))


def float_input(seed: int = 1) -> np.ndarray:
    """A [1, 224, 224, 3] float32 input, uniform in [-1, 1]."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (1, SIZE, SIZE, 3)).astype(np.float32)


def calibrate(layers: Sequence[Layer], x: np.ndarray) -> Quant:
    """Scale and zero point of every activation (asymmetric int8 over the observed range,
    always holding zero) from one float run of ``layers`` on ``x`` through the reference
    driver, on its numpy kernels: the quantized model must not depend on whether the native
    float kernels (a different float32 summation order) are loaded."""
    from nnhal import Session
    from nnhal.ops import native

    model = build(layers, expose=True)
    with native.disabled("calibration runs the numpy kernels"):
        session = Session(model)
        try:
            outs = list(session.run([x]).values())
        finally:
            session.close()
    ranges = {0: (float(x.min()), float(x.max()))}
    for k, arr in zip(sorted({layer.dst for layer in layers}), outs):
        ranges[k] = (float(arr.min()), float(arr.max()))
    quant: Quant = {}
    for k, (lo, hi) in ranges.items():
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max(hi - lo, 1e-6) / 255.0
        zp = int(np.clip(np.round(-128 - lo / scale), -128, 127))
        quant[k] = (float(np.float32(scale)), zp)
    return quant


def quantize_input(x: np.ndarray, quant: Quant) -> np.ndarray:
    scale, zp = quant[0]
    return np.clip(np.round(x / scale) + zp, -128, 127).astype(np.int8)


def mobilenet_v2_int8(seed: int = 0, *, with_logits: bool = True
                      ) -> tuple[Model, np.ndarray, Quant]:
    """The full-integer MobileNetV2 (see the module's text), its int8 input (the quantized
    calibration input) and the quantization of every activation. With ``with_logits`` the
    model's second output is the int8 logits (the FULLY_CONNECTED output), a finer check than
    the softmax alone."""
    layers = mobilenet_v2_layers(seed)
    x = float_input(seed + 1)
    quant = calibrate(layers, x)
    extra = (layers[-2].dst,) if with_logits else ()
    model = build(layers, quant, extra_outputs=extra)
    return model, quantize_input(x, quant), quant
