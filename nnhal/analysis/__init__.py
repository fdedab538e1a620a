"""The one analysis of a HAL Model into a checked, immutable graph (see ``analyse``)."""

from nnhal.analysis.analyser import (
    MAX_TENSOR_BYTES,
    MAX_WORK,
    about,
    analyse,
    decode_constant,
    io_signature,
    map_pools,
    max_work_default,
    operand_info,
    operand_shape,
    work_of,
)
from nnhal.analysis.graph import ModelGraph, OperationTuple, SubgraphGraph
from nnhal.analysis.kept import analyses

__all__ = ["MAX_TENSOR_BYTES", "MAX_WORK", "ModelGraph", "OperationTuple", "SubgraphGraph",
           "about", "analyse", "analyses", "decode_constant", "io_signature", "map_pools",
           "max_work_default", "operand_info", "operand_shape", "work_of"]
