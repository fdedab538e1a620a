"""Generate ``include/NeuralNetworks.h`` from nnhal's own enums, so header and runtime agree.

The names, values and struct layouts are the NDK's (facts of its interface, up to feature
level 8; levels 6 and 7 added operations, not functions); the text is ours. ``python -m
nnhal.capi.header`` rewrites the file; a test checks it is up to date. Stdlib plus nnhal's
enum modules only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperandType, OperationType
from nnhal.runtime import codes

HEADER = Path(__file__).with_name("include") / "NeuralNetworks.h"
#: Beside it, as upstream: the vendor extension calls (``#include "NeuralNetworksExtensions.h"``).
EXTENSIONS_HEADER = HEADER.with_name("NeuralNetworksExtensions.h")

_HAL_ONLY_OPERANDS = {"OEM", "TENSOR_OEM_BYTE"}
_OPERAND_NAMES = {"SUBGRAPH": "MODEL"}  # the NDK calls a subgraph operand a MODEL


def operand_codes() -> list[tuple[str, int]]:
    """OperandCode: the HAL's operand types without the OEM ones; SUBGRAPH is MODEL."""
    return [("ANEURALNETWORKS_" + _OPERAND_NAMES.get(t.name, t.name), int(t))
            for t in OperandType if t.name not in _HAL_ONLY_OPERANDS]


def operation_codes() -> list[tuple[str, int]]:
    """OperationCode: the HAL's operations without OEM_OPERATION."""
    return [("ANEURALNETWORKS_" + t.name, int(t)) for t in OperationType  # type: ignore[attr-defined]
            if t.name != "OEM_OPERATION"]


def enums() -> list[tuple[str, list[tuple[str, int]]]]:
    """Every enum of the header as (typedef name, [(constant, value)])."""
    p = "ANEURALNETWORKS_"
    return [
        ("OperandCode", operand_codes()),
        ("OperationCode", operation_codes()),
        ("FuseCode", [(p + "FUSED_NONE", 0), (p + "FUSED_RELU", 1), (p + "FUSED_RELU1", 2),
                      (p + "FUSED_RELU6", 3)]),
        ("PaddingCode", [(p + "PADDING_SAME", 1), (p + "PADDING_VALID", 2)]),
        ("PreferenceCode", [(p + "PREFER_" + c.name, int(c)) for c in codes.PreferenceCode]),
        ("DeviceTypeCode", [(p + "DEVICE_" + c.name, int(c)) for c in codes.DeviceTypeCode]),
        ("FeatureLevelCode", [(f"{p}FEATURE_LEVEL_{v.level}", v.ndk) for v in FeatureLevel]),
        ("ResultCode", [(p + c.name, int(c)) for c in codes.ResultCode]),
        ("DurationCode", [(p + ("FENCED_DURATION_" + c.name[len("FENCED_"):]
                                if c.name.startswith("FENCED_") else "DURATION_" + c.name),
                           int(c)) for c in codes.DurationCode]),
        ("PriorityCode", [(p + "PRIORITY_" + c.name, int(c)) for c in codes.PriorityCode]),
    ]


_OPAQUE = ["ANeuralNetworksMemory", "ANeuralNetworksModel", "ANeuralNetworksCompilation",
           "ANeuralNetworksExecution", "ANeuralNetworksBurst", "ANeuralNetworksEvent",
           "ANeuralNetworksDevice", "ANeuralNetworksMemoryDesc"]

#: The functions the library exports (return type, name, parameters), up to feature level 8.
FUNCTIONS: list[tuple[str, str, str]] = [
    ("int64_t", "ANeuralNetworks_getRuntimeFeatureLevel", "void"),
    ("uint64_t", "ANeuralNetworks_getDefaultLoopTimeout", "void"),
    ("uint64_t", "ANeuralNetworks_getMaximumLoopTimeout", "void"),
    ("int", "ANeuralNetworks_getDeviceCount", "uint32_t* numDevices"),
    ("int", "ANeuralNetworks_getDevice", "uint32_t devIndex, ANeuralNetworksDevice** device"),
    ("int", "ANeuralNetworksDevice_getName",
     "const ANeuralNetworksDevice* device, const char** name"),
    ("int", "ANeuralNetworksDevice_getType", "const ANeuralNetworksDevice* device, int32_t* type"),
    ("int", "ANeuralNetworksDevice_getVersion",
     "const ANeuralNetworksDevice* device, const char** version"),
    ("int", "ANeuralNetworksDevice_getFeatureLevel",
     "const ANeuralNetworksDevice* device, int64_t* featureLevel"),
    ("int", "ANeuralNetworksDevice_wait", "const ANeuralNetworksDevice* device"),
    ("int", "ANeuralNetworksModel_create", "ANeuralNetworksModel** model"),
    ("void", "ANeuralNetworksModel_free", "ANeuralNetworksModel* model"),
    ("int", "ANeuralNetworksModel_finish", "ANeuralNetworksModel* model"),
    ("int", "ANeuralNetworksModel_addOperand",
     "ANeuralNetworksModel* model, const ANeuralNetworksOperandType* type"),
    ("int", "ANeuralNetworksModel_setOperandValue",
     "ANeuralNetworksModel* model, int32_t index, const void* buffer, size_t length"),
    ("int", "ANeuralNetworksModel_setOperandValueFromMemory",
     "ANeuralNetworksModel* model, int32_t index, const ANeuralNetworksMemory* memory, "
     "size_t offset, size_t length"),
    ("int", "ANeuralNetworksModel_setOperandValueFromModel",
     "ANeuralNetworksModel* model, int32_t index, const ANeuralNetworksModel* value"),
    ("int", "ANeuralNetworksModel_setOperandSymmPerChannelQuantParams",
     "ANeuralNetworksModel* model, int32_t index, "
     "const ANeuralNetworksSymmPerChannelQuantParams* channelQuant"),
    ("int", "ANeuralNetworksModel_addOperation",
     "ANeuralNetworksModel* model, ANeuralNetworksOperationType type, uint32_t inputCount, "
     "const uint32_t* inputs, uint32_t outputCount, const uint32_t* outputs"),
    ("int", "ANeuralNetworksModel_identifyInputsAndOutputs",
     "ANeuralNetworksModel* model, uint32_t inputCount, const uint32_t* inputs, "
     "uint32_t outputCount, const uint32_t* outputs"),
    ("int", "ANeuralNetworksModel_relaxComputationFloat32toFloat16",
     "ANeuralNetworksModel* model, bool allow"),
    ("int", "ANeuralNetworksModel_getSupportedOperationsForDevices",
     "const ANeuralNetworksModel* model, const ANeuralNetworksDevice* const* devices, "
     "uint32_t numDevices, bool* supportedOps"),
    ("int", "ANeuralNetworksCompilation_create",
     "ANeuralNetworksModel* model, ANeuralNetworksCompilation** compilation"),
    ("int", "ANeuralNetworksCompilation_createForDevices",
     "ANeuralNetworksModel* model, const ANeuralNetworksDevice* const* devices, "
     "uint32_t numDevices, ANeuralNetworksCompilation** compilation"),
    ("void", "ANeuralNetworksCompilation_free", "ANeuralNetworksCompilation* compilation"),
    ("int", "ANeuralNetworksCompilation_setPreference",
     "ANeuralNetworksCompilation* compilation, int32_t preference"),
    ("int", "ANeuralNetworksCompilation_setPriority",
     "ANeuralNetworksCompilation* compilation, int priority"),
    ("int", "ANeuralNetworksCompilation_setTimeout",
     "ANeuralNetworksCompilation* compilation, uint64_t duration"),
    ("int", "ANeuralNetworksCompilation_setCaching",
     "ANeuralNetworksCompilation* compilation, const char* cacheDir, const uint8_t* token"),
    ("int", "ANeuralNetworksCompilation_finish", "ANeuralNetworksCompilation* compilation"),
    ("int", "ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput",
     "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* alignment"),
    ("int", "ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput",
     "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* padding"),
    ("int", "ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput",
     "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* alignment"),
    ("int", "ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput",
     "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* padding"),
    ("int", "ANeuralNetworksBurst_create",
     "ANeuralNetworksCompilation* compilation, ANeuralNetworksBurst** burst"),
    ("void", "ANeuralNetworksBurst_free", "ANeuralNetworksBurst* burst"),
    ("int", "ANeuralNetworksExecution_create",
     "ANeuralNetworksCompilation* compilation, ANeuralNetworksExecution** execution"),
    ("void", "ANeuralNetworksExecution_free", "ANeuralNetworksExecution* execution"),
    ("int", "ANeuralNetworksExecution_setInput",
     "ANeuralNetworksExecution* execution, int32_t index, "
     "const ANeuralNetworksOperandType* type, const void* buffer, size_t length"),
    ("int", "ANeuralNetworksExecution_setOutput",
     "ANeuralNetworksExecution* execution, int32_t index, "
     "const ANeuralNetworksOperandType* type, void* buffer, size_t length"),
    ("int", "ANeuralNetworksExecution_setInputFromMemory",
     "ANeuralNetworksExecution* execution, int32_t index, "
     "const ANeuralNetworksOperandType* type, const ANeuralNetworksMemory* memory, "
     "size_t offset, size_t length"),
    ("int", "ANeuralNetworksExecution_setOutputFromMemory",
     "ANeuralNetworksExecution* execution, int32_t index, "
     "const ANeuralNetworksOperandType* type, const ANeuralNetworksMemory* memory, "
     "size_t offset, size_t length"),
    ("int", "ANeuralNetworksExecution_compute", "ANeuralNetworksExecution* execution"),
    ("int", "ANeuralNetworksExecution_startCompute",
     "ANeuralNetworksExecution* execution, ANeuralNetworksEvent** event"),
    ("int", "ANeuralNetworksExecution_startComputeWithDependencies",
     "ANeuralNetworksExecution* execution, const ANeuralNetworksEvent* const* dependencies, "
     "uint32_t num_dependencies, uint64_t duration, ANeuralNetworksEvent** event"),
    ("int", "ANeuralNetworksExecution_burstCompute",
     "ANeuralNetworksExecution* execution, ANeuralNetworksBurst* burst"),
    ("int", "ANeuralNetworksExecution_setMeasureTiming",
     "ANeuralNetworksExecution* execution, bool measure"),
    ("int", "ANeuralNetworksExecution_getDuration",
     "const ANeuralNetworksExecution* execution, int32_t durationCode, uint64_t* duration"),
    ("int", "ANeuralNetworksExecution_setTimeout",
     "ANeuralNetworksExecution* execution, uint64_t duration"),
    ("int", "ANeuralNetworksExecution_setLoopTimeout",
     "ANeuralNetworksExecution* execution, uint64_t duration"),
    ("int", "ANeuralNetworksExecution_getOutputOperandRank",
     "ANeuralNetworksExecution* execution, int32_t index, uint32_t* rank"),
    ("int", "ANeuralNetworksExecution_getOutputOperandDimensions",
     "ANeuralNetworksExecution* execution, int32_t index, uint32_t* dimensions"),
    ("int", "ANeuralNetworksExecution_setReusable",
     "ANeuralNetworksExecution* execution, bool reusable"),
    ("int", "ANeuralNetworksExecution_enableInputAndOutputPadding",
     "ANeuralNetworksExecution* execution, bool enable"),
    ("int", "ANeuralNetworksEvent_wait", "ANeuralNetworksEvent* event"),
    ("void", "ANeuralNetworksEvent_free", "ANeuralNetworksEvent* event"),
    ("int", "ANeuralNetworksEvent_createFromSyncFenceFd",
     "int sync_fence_fd, ANeuralNetworksEvent** event"),
    ("int", "ANeuralNetworksEvent_getSyncFenceFd",
     "const ANeuralNetworksEvent* event, int* sync_fence_fd"),
    ("int", "ANeuralNetworksMemory_createFromFd",
     "size_t size, int protect, int fd, size_t offset, ANeuralNetworksMemory** memory"),
    ("int", "ANeuralNetworksMemory_createFromDesc",
     "const ANeuralNetworksMemoryDesc* desc, ANeuralNetworksMemory** memory"),
    ("int", "ANeuralNetworksMemory_copy",
     "const ANeuralNetworksMemory* src, const ANeuralNetworksMemory* dst"),
    ("void", "ANeuralNetworksMemory_free", "ANeuralNetworksMemory* memory"),
    ("int", "ANeuralNetworksMemoryDesc_create", "ANeuralNetworksMemoryDesc** desc"),
    ("void", "ANeuralNetworksMemoryDesc_free", "ANeuralNetworksMemoryDesc* desc"),
    ("int", "ANeuralNetworksMemoryDesc_addInputRole",
     "ANeuralNetworksMemoryDesc* desc, const ANeuralNetworksCompilation* compilation, "
     "uint32_t index, float frequency"),
    ("int", "ANeuralNetworksMemoryDesc_addOutputRole",
     "ANeuralNetworksMemoryDesc* desc, const ANeuralNetworksCompilation* compilation, "
     "uint32_t index, float frequency"),
    ("int", "ANeuralNetworksMemoryDesc_setDimensions",
     "ANeuralNetworksMemoryDesc* desc, uint32_t rank, const uint32_t* dimensions"),
    ("int", "ANeuralNetworksMemoryDesc_finish", "ANeuralNetworksMemoryDesc* desc"),
    ("int", "ANeuralNetworksCompilation_addExtensionAttribute",
     "ANeuralNetworksCompilation* compilation, const char* extensionName, "
     "uint16_t attributeCodeWithinExtension, const void* data, size_t length"),
    ("int", "ANeuralNetworksExecution_addExtensionAttribute",
     "ANeuralNetworksExecution* execution, const char* extensionName, "
     "uint16_t attributeCodeWithinExtension, const void* data, size_t length"),
]

#: NeuralNetworksExtensions.h's functions (feature level 3), exported by the same library.
EXTENSION_FUNCTIONS: list[tuple[str, str, str]] = [
    ("int", "ANeuralNetworksDevice_getExtensionSupport",
     "const ANeuralNetworksDevice* device, const char* extensionName, "
     "bool* isExtensionSupported"),
    ("int", "ANeuralNetworksModel_getExtensionOperandType",
     "ANeuralNetworksModel* model, const char* extensionName, "
     "uint16_t operandCodeWithinExtension, int32_t* type"),
    ("int", "ANeuralNetworksModel_getExtensionOperationType",
     "ANeuralNetworksModel* model, const char* extensionName, "
     "uint16_t operationCodeWithinExtension, ANeuralNetworksOperationType* type"),
    ("int", "ANeuralNetworksModel_setOperandExtensionData",
     "ANeuralNetworksModel* model, int32_t index, const void* data, size_t length"),
]

_BY_LEVEL = {
    2: ["ANeuralNetworksModel_relaxComputationFloat32toFloat16"],
    3: ["ANeuralNetworks_getDeviceCount", "ANeuralNetworks_getDevice",
        "ANeuralNetworksDevice_getName", "ANeuralNetworksDevice_getType",
        "ANeuralNetworksDevice_getVersion", "ANeuralNetworksDevice_getFeatureLevel",
        "ANeuralNetworksModel_setOperandSymmPerChannelQuantParams",
        "ANeuralNetworksModel_getSupportedOperationsForDevices",
        "ANeuralNetworksCompilation_createForDevices", "ANeuralNetworksCompilation_setCaching",
        "ANeuralNetworksBurst_create", "ANeuralNetworksBurst_free",
        "ANeuralNetworksExecution_compute", "ANeuralNetworksExecution_burstCompute",
        "ANeuralNetworksExecution_setMeasureTiming", "ANeuralNetworksExecution_getDuration",
        "ANeuralNetworksExecution_getOutputOperandRank",
        "ANeuralNetworksExecution_getOutputOperandDimensions",
        *(name for _, name, _ in EXTENSION_FUNCTIONS)],
    4: ["ANeuralNetworks_getDefaultLoopTimeout", "ANeuralNetworks_getMaximumLoopTimeout",
        "ANeuralNetworksDevice_wait", "ANeuralNetworksModel_setOperandValueFromModel",
        "ANeuralNetworksCompilation_setPriority", "ANeuralNetworksCompilation_setTimeout",
        "ANeuralNetworksExecution_startComputeWithDependencies",
        "ANeuralNetworksExecution_setTimeout", "ANeuralNetworksExecution_setLoopTimeout",
        "ANeuralNetworksEvent_createFromSyncFenceFd", "ANeuralNetworksEvent_getSyncFenceFd",
        "ANeuralNetworksMemory_createFromDesc", "ANeuralNetworksMemory_copy",
        "ANeuralNetworksMemoryDesc_create", "ANeuralNetworksMemoryDesc_free",
        "ANeuralNetworksMemoryDesc_addInputRole", "ANeuralNetworksMemoryDesc_addOutputRole",
        "ANeuralNetworksMemoryDesc_setDimensions", "ANeuralNetworksMemoryDesc_finish"],
    5: ["ANeuralNetworks_getRuntimeFeatureLevel",
        "ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput",
        "ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput",
        "ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput",
        "ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput",
        "ANeuralNetworksExecution_setReusable",
        "ANeuralNetworksExecution_enableInputAndOutputPadding"],
    8: ["ANeuralNetworksCompilation_addExtensionAttribute",
        "ANeuralNetworksExecution_addExtensionAttribute"],
}
#: The feature level that brought each function (the others came with level 1).
SINCE: dict[str, FeatureLevel] = {
    name: FeatureLevel.of_level(level)
    for level, names in _BY_LEVEL.items() for name in names}


def since(name: str) -> FeatureLevel:
    """The feature level that brought function ``name``."""
    return SINCE.get(name, FeatureLevel.V1_0)


def render() -> str:
    """The header's text."""
    out = [
        "/* NeuralNetworks.h of nnhal: the NNAPI NDK interface up to feature level 8.",
        " *",
        " * Generated by `python -m nnhal.capi.header` from nnhal's enums; do not edit.",
        " * Names, values and struct layouts are those of Android's NDK, so client code",
        " * written for it compiles unchanged; the functions are implemented by nnhal's",
        " * libneuralnetworks.so (see `nnhal ndk --libdir`). */",
        "",
        "#ifndef NNHAL_NEURAL_NETWORKS_H",
        "#define NNHAL_NEURAL_NETWORKS_H",
        "",
        "#include <stdbool.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
    ]
    for name, items in enums():
        out.append("typedef enum {")
        out += [f"    {k} = {v}," for k, v in items]
        if name == "PriorityCode":
            out.append("    ANEURALNETWORKS_PRIORITY_DEFAULT = ANEURALNETWORKS_PRIORITY_MEDIUM,")
        out += [f"}} {name};", ""]
    out += [
        "enum { ANEURALNETWORKS_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES = "
        f"{codes.MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES} }};",
        f"enum {{ ANEURALNETWORKS_BYTE_SIZE_OF_CACHE_TOKEN = {codes.BYTE_SIZE_OF_CACHE_TOKEN} }};",
        "",
    ]
    out += [f"typedef struct {n} {n};" for n in _OPAQUE]
    out += [
        "",
        "/* An operand's type: dimensions of 0 (or dimensionCount 0 for a tensor) are unknown. */",
        "typedef struct ANeuralNetworksOperandType {",
        "    int32_t type;",
        "    uint32_t dimensionCount;",
        "    const uint32_t* dimensions;",
        "    float scale;",
        "    int32_t zeroPoint;",
        "} ANeuralNetworksOperandType;",
        "",
        "typedef struct ANeuralNetworksSymmPerChannelQuantParams {",
        "    uint32_t channelDim;",
        "    uint32_t scaleCount;",
        "    const float* scales;",
        "} ANeuralNetworksSymmPerChannelQuantParams;",
        "",
        "typedef int32_t ANeuralNetworksOperationType;",
        "",
        "/* Each function's feature level: ANEURALNETWORKS_FEATURE_LEVEL_<n> of FeatureLevelCode",
        " * (what ANeuralNetworks_getRuntimeFeatureLevel answers must be at least its value). */",
        "#define NNHAL_AVAILABLE_SINCE(level)",
        "",
    ]
    out += _declarations(FUNCTIONS)
    out += ["", "#ifdef __cplusplus", "}", "#endif", "", "#endif  /* NNHAL_NEURAL_NETWORKS_H */",
            ""]
    return "\n".join(out)


def _declarations(functions: list[tuple[str, str, str]]) -> list[str]:
    out = []
    for ret, name, params in functions:
        level = since(name).level
        out.append(f"{ret} {name}({params})\n"
                   f"        NNHAL_AVAILABLE_SINCE(ANEURALNETWORKS_FEATURE_LEVEL_{level});")
    return out


def render_extensions() -> str:
    """``NeuralNetworksExtensions.h``: the vendor extension calls, beside NeuralNetworks.h."""
    out = [
        "/* NeuralNetworksExtensions.h of nnhal: the NNAPI NDK's vendor extension calls.",
        " *",
        " * Generated by `python -m nnhal.capi.header`; do not edit. An extension operand or",
        " * operation type is the extension's prefix (assigned by the runtime, once per process)",
        " * in the high 16 bits and the code within the extension in the low 16 bits; use",
        " * ANeuralNetworksModel_getExtensionOperandType / OperationType to get one. Extension",
        " * data (ANeuralNetworksModel_setOperandExtensionData) is the extension's to read. */",
        "",
        "#ifndef NNHAL_NEURAL_NETWORKS_EXTENSIONS_H",
        "#define NNHAL_NEURAL_NETWORKS_EXTENSIONS_H",
        "",
        '#include "NeuralNetworks.h"',
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        *_declarations(EXTENSION_FUNCTIONS),
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        "#endif  /* NNHAL_NEURAL_NETWORKS_EXTENSIONS_H */",
        "",
    ]
    return "\n".join(out)




# ---- the C library's exported functions ---------------------------------------------------

def _c_param(param: str) -> tuple[str, str, str]:
    """(Py_BuildValue code, C cast, name) of one parameter."""
    param = param.strip()
    name = param.replace("*", " ").split()[-1]
    ctype = param[: len(param) - len(name)].strip()
    if "*" in ctype:
        return "K", "(unsigned long long)(uintptr_t)", name
    code = {"int32_t": "i", "int": "i", "ANeuralNetworksOperationType": "i", "bool": "i",
            "uint32_t": "I", "uint16_t": "I", "size_t": "K", "uint64_t": "K", "float": "d"}[ctype]
    cast = {"i": "(int)", "I": "(unsigned int)", "K": "(unsigned long long)",
            "d": "(double)"}[code]
    return code, cast, name


#: The answers of the three value getters when Python cannot run (never started, or gone):
#: their values, which need no Python. Every other function answers OP_FAILED when no Python
#: can ever run in the process and BAD_STATE when it cannot run now; a free does nothing.
_UNRUNNABLE = {
    "ANeuralNetworks_getRuntimeFeatureLevel": (f"{codes.RUNTIME_FEATURE_LEVEL.ndk}",) * 2,
    "ANeuralNetworks_getDefaultLoopTimeout": (f"{codes.DEFAULT_LOOP_TIMEOUT_NS}ULL",) * 2,
    "ANeuralNetworks_getMaximumLoopTimeout": (f"{codes.MAXIMUM_LOOP_TIMEOUT_NS}ULL",) * 2,
}


def render_wrappers() -> str:
    """``wrappers.inc``: each NDK function hands its arguments to the bridge, by name."""
    out = ["/* Generated by `python -m nnhal.capi.header`; do not edit. */", ""]
    for ret, name, params in [*FUNCTIONS, *EXTENSION_FUNCTIONS]:
        parts = [] if params == "void" else [_c_param(p) for p in params.split(",")]
        fmt = "(" + "".join(p[0] for p in parts) + ")"
        args = "".join(f", {cast}{n}" for _, cast, n in parts)
        fallback, closed = _UNRUNNABLE.get(name) or {
            "int": ("ANEURALNETWORKS_OP_FAILED", "ANEURALNETWORKS_BAD_STATE"),
            "void": ("0", "0")}[ret]
        call = f'nn_call("{name}", {fallback}, {closed}, "{fmt}"{args})'
        out.append(f"NN_EXPORT {ret} {name}({params}) {{")
        out.append(f"    {call};" if ret == "void" else f"    return ({ret}){call};")
        out += ["}", ""]
    return "\n".join(out)


WRAPPERS = Path(__file__).with_name("wrappers.inc")


def write_all() -> list[Path]:
    HEADER.write_text(render(), encoding="ascii")
    EXTENSIONS_HEADER.write_text(render_extensions(), encoding="ascii")
    WRAPPERS.write_text(render_wrappers(), encoding="ascii")
    return [HEADER, EXTENSIONS_HEADER, WRAPPERS]


def main() -> int:
    for path in write_all():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
