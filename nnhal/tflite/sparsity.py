"""TFLite's sparse tensor format made dense, as DENSIFY does at run time.

A sparse tensor of rank n with k blocked dimensions is stored as n + k levels walked in
``traversal_order``: each level is DENSE (every index 0..dense_size-1) or SPARSE_CSR
(``array_segments`` gives, for each position of the level above, the range of
``array_indices`` present). Level n + b is the inner block of original dimension
``block_map[b]``. The values are stored in the order of that walk.

The walk is done one level at a time over numpy arrays of positions, not per element.
"""

from __future__ import annotations

import numpy as np
import tflite
from tflite.DimensionType import DimensionType
from tflite.SparseIndexVector import SparseIndexVector

from nnhal.errors import ModelFileError

#: The most elements a densified tensor (or one level of its walk) may have: a corrupted
#: shape must not make the reader allocate without bound.
MAX_DENSE_ELEMENTS = 1 << 24

_VECTORS = {SparseIndexVector.Int32Vector: tflite.Int32Vector,
            SparseIndexVector.Uint16Vector: tflite.Uint16Vector,
            SparseIndexVector.Uint8Vector: tflite.Uint8Vector}


def _index_vector(kind: int, table: object, where: str) -> np.ndarray:
    cls = _VECTORS.get(kind)
    if cls is None or table is None:
        raise ValueError(f"{where}: sparse index vector of type {kind} is not readable")
    vec = cls()
    vec.Init(table.Bytes, table.Pos)
    if vec.ValuesLength() == 0:
        return np.zeros(0, np.int64)
    return np.asarray(vec.ValuesAsNumpy(), dtype=np.int64)


def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: tflite.SparsityParameters,
            file: str, where: str) -> np.ndarray:
    """The dense array of ``shape`` whose non-zero entries ``values`` holds in sparse form."""
    n = len(shape)
    order = ([int(v) for v in sparsity.TraversalOrderAsNumpy()]
             if sparsity.TraversalOrderLength() else list(range(n)))
    block_map = ([int(v) for v in sparsity.BlockMapAsNumpy()]
                 if sparsity.BlockMapLength() else [])
    levels = len(order)
    total = int(np.prod(shape, dtype=np.float64)) if shape else 1
    if total > MAX_DENSE_ELEMENTS or any(d <= 0 for d in shape):
        raise ModelFileError(file, f"{where}: sparse tensor of shape {list(shape)} is out of "
                                   f"range")
    if (levels != n + len(block_map) or sorted(order) != list(range(levels))
            or sparsity.DimMetadataLength() != levels
            or any(not 0 <= d < n for d in block_map)):
        raise ModelFileError(file, f"{where}: inconsistent sparsity parameters")
    metas = [sparsity.DimMetadata(i) for i in range(levels)]
    # Size of each expanded dimension (outer dims divided by their block, then block dims).
    block_size = {}
    for b, d in enumerate(block_map):
        level = order.index(n + b)
        block_size[d] = int(metas[level].DenseSize())
        if block_size[d] <= 0 or shape[d] % block_size[d]:
            raise ModelFileError(file, f"{where}: block size does not divide the dimension")
    # pos: position of each partial path in the level's storage; coords: index per level.
    pos = np.zeros(1, np.int64)
    coords: list[np.ndarray] = []
    for meta in metas:
        if meta.Format() == DimensionType.DENSE:
            size = int(meta.DenseSize())
            if size < 0 or pos.size * max(size, 1) > MAX_DENSE_ELEMENTS:
                raise ModelFileError(file, f"{where}: dense size {size} out of range")
            coords = [np.repeat(c, size) for c in coords]
            coords.append(np.tile(np.arange(size, dtype=np.int64), pos.size))
            pos = (pos[:, None] * size + np.arange(size, dtype=np.int64)).reshape(-1)
        else:
            seg = _index_vector(meta.ArraySegmentsType(), meta.ArraySegments(), where)
            idx = _index_vector(meta.ArrayIndicesType(), meta.ArrayIndices(), where)
            if pos.size and (pos.max() + 1 >= seg.size or seg[-1] > idx.size
                             or np.any(np.diff(seg) < 0)):
                raise ModelFileError(file, f"{where}: sparse segments out of range")
            starts, ends = seg[pos], seg[pos + 1]
            counts = ends - starts
            total = int(counts.sum())
            offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts,
                                                                   counts)
            new_pos = np.repeat(starts, counts) + offsets
            coords = [np.repeat(c, counts) for c in coords]
            coords.append(idx[new_pos])
            pos = new_pos
    flat = values.reshape(-1)
    if pos.size and pos.max() >= flat.size:
        raise ModelFileError(file, f"{where}: sparse values shorter than their indexes")
    full = [np.zeros(pos.size, np.int64) for _ in range(n)]
    for level, d in enumerate(order):
        if d < n:
            full[d] = full[d] + coords[level] * block_size.get(d, 1)
        else:
            full[block_map[d - n]] = full[block_map[d - n]] + coords[level]
    out = np.zeros(shape, values.dtype)
    if any(np.any((f < 0) | (f >= s)) for f, s in zip(full, shape)):
        raise ModelFileError(file, f"{where}: sparse index out of range")
    out[tuple(full)] = flat[pos]
    return out
