"""Child of test_fuzz_capi: random NDK calls with hostile arguments through ctypes into the
library. argv: library path, seed, number of calls, log file. Each call is logged before it
is made (so a death names it); exits 0 after printing a summary, 1 on an undefined answer."""

import ctypes
import os
import random
import sys
from pathlib import Path

from nnhal.capi import ctypes_ndk
from nnhal.capi.header import EXTENSION_FUNCTIONS, FUNCTIONS, since
from nnhal.core.version import FeatureLevel
from nnhal.drivers import registry
from nnhal.runtime.codes import ResultCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from hint_device import EXTENSION, HintDevice  # noqa: E402

CODES = {int(c) for c in ResultCode}
GETTERS = {"ANeuralNetworks_getRuntimeFeatureLevel": 1000008,
           "ANeuralNetworks_getDefaultLoopTimeout": 2_000_000_000,
           "ANeuralNetworks_getMaximumLoopTimeout": 15_000_000_000}
_KEEP: list = []  # every buffer handed to the library stays alive (the API may keep pointers)


def buf(n: int, fill: bytes = b"") -> int:
    b = ctypes.create_string_buffer(fill.ljust(n, b"\0")[:n] if fill else n, n)
    _KEEP.append(b)
    return ctypes.addressof(b)


def main() -> int:
    path, seed, calls, log_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    # A device with an extension, so extension attributes can get past the name check.
    registry.register("hints", HintDevice)
    lib = ctypes_ndk.load(path)
    rng = random.Random(seed)
    log = open(log_path, "w", buffering=1)  # noqa: SIM115
    live: list[int] = []   # handles the library gave out
    freed: list[int] = []
    r, w = os.pipe()
    fds = [-1, 0, 1, 2, r, w, os.eventfd(0), os.eventfd(1), 4095]
    mem = os.memfd_create("fuzz")
    os.ftruncate(mem, 4096)
    fds.append(mem)

    def handle() -> int | None:
        pick = rng.random()
        if pick < 0.5 and live:
            return rng.choice(live)
        if pick < 0.65 and freed:
            return rng.choice(freed)
        if pick < 0.8:
            return buf(64, bytes(rng.randrange(256) for _ in range(8)))  # client memory
        return rng.choice([None, 0x7E57_0000_0010 + 16 * rng.randrange(1 << 20),
                           0xDEAD_BEEF_0000])

    def count() -> int:
        return rng.choice([0, 1, 2, 3, 4, 7, 1000, 1 << 20, 1 << 31, (1 << 32) - 1])

    def array(elem: int) -> int | None:
        """NULL, a short buffer (a count reads past it), or a roomy one, of random bytes."""
        pick = rng.random()
        if pick < 0.15:
            return None
        n = elem * rng.choice([1, 2]) if pick < 0.6 else 4096
        words = [rng.choice([0, 1, 2, 3, 4, 5, 0xFFFFFFFF]) for _ in range(n // 4)]
        return buf(n, b"".join(x.to_bytes(4, "little") for x in words))

    def operand_type() -> int | None:
        if rng.random() < 0.15:
            return None
        t = rng.choice([0, 1, 2, 3, 4, 6, 12, 13, 99, -1])
        dims = array(4)
        n = count() if rng.random() < 0.3 else rng.choice([0, 1, 2, 4])
        s = ctypes_ndk._OperandType(t, n, ctypes.cast(dims, ctypes.POINTER(ctypes.c_uint32)),
                                    rng.choice([0.0, 0.5, -1.0, float("nan")]),
                                    rng.choice([0, 1, -1, 300]))
        _KEEP.append(s)
        return ctypes.addressof(s)

    def arg(decl: str) -> object:
        decl = decl.strip()
        name = decl.replace("*", " ").split()[-1]
        t = decl[: len(decl) - len(name)].strip()
        stars = t.count("*")
        base = t.replace("const", "").replace("*", "").strip()
        if stars == 2 or (stars == 1 and not decl.startswith("const") and base in (
                "uint32_t", "int32_t", "int64_t", "uint64_t", "bool", "int")):
            return None if rng.random() < 0.1 else buf(4096)  # out-parameter: room enough
        if stars and base == "ANeuralNetworksOperandType":
            return operand_type()
        if stars and base == "ANeuralNetworksSymmPerChannelQuantParams":
            s = ctypes_ndk._ChannelQuant(rng.randrange(4), count() % 9 if rng.random() < 0.7
                                         else count(),
                                         ctypes.cast(array(4), ctypes.POINTER(ctypes.c_float)))
            _KEEP.append(s)
            return None if rng.random() < 0.1 else ctypes.addressof(s)
        if stars and base == "ANeuralNetworksOperationType":  # an out-parameter, an int32
            return array(4)
        if stars and base.startswith("ANeuralNetworks") and "const*" not in t.replace(" ", ""):
            return handle()
        if stars and base.startswith("ANeuralNetworks"):  # an array of handles
            if rng.random() < 0.5:
                hs = [handle() or 0 for _ in range(rng.choice([1, 2, 4]))]
                return buf(8 * len(hs), b"".join(h.to_bytes(8, "little") for h in hs))
            return array(8)
        if stars and base == "char" and name == "extensionName":
            pick = rng.choice([None, EXTENSION, EXTENSION, "com.example.unknown", "", "x" * 5000])
            return None if pick is None else buf(len(pick) + 1, pick.encode())
        if stars and base == "char":
            return None if rng.random() < 0.3 else buf(16, b"/nonexistent/dir"[:16])
        if stars:  # uint32/float arrays, tokens, buffers
            return array(4)
        if name in ("fd", "syncFenceFd"):
            return rng.choice(fds)
        if base == "float":
            return rng.choice([0.0, 1.0, -1.0, float("nan"), float("inf")])
        if base == "size_t" or base == "uint64_t":
            return rng.choice([0, 1, 4, 16, 64, 4096, 1 << 40, (1 << 64) - 1])
        if base == "uint32_t":
            return count() if rng.random() < 0.5 else rng.randrange(8)
        if base == "uint16_t":
            return rng.choice([0, 1, 2, 0xFFFF])
        if base == "bool":
            return rng.choice([0, 1])
        return rng.choice([0, 1, 2, 3, -1, 7, 100, 1 << 30, -(1 << 31), rng.randrange(110)])

    # Feature level 8's functions weigh as much as the level-5 surface's tenth each, so every
    # seed makes a few hundred of them.
    funcs = [(ret, name, [] if params == "void" else params.split(","))
             for ret, name, params in [*FUNCTIONS, *EXTENSION_FUNCTIONS]
             for _ in range(8 if since(name) is FeatureLevel.AIDL_V4 else 1)]
    made = 0
    level8 = [0, 0]  # calls of feature level 8's functions, answered NO_ERROR
    for i in range(calls):
        ret, name, params = rng.choice(funcs)
        if since(name) is FeatureLevel.AIDL_V4:
            level8[0] += 1
        args = [arg(p) for p in params]
        # An output buffer gets the room its length says (the client's promise in C).
        if name in ("ANeuralNetworksExecution_setOutput", "ANeuralNetworksExecution_setInput"):
            args[3] = buf(4096)
            args[4] = rng.choice([0, 4, 16, 64, 4096, 1 << 40, (1 << 64) - 1])
        log.write(f"{i} {name} {args}\n")
        fn = getattr(lib, name)
        got = fn(*args)
        if ret == "void":
            if args[0] in live:
                live.remove(args[0])
                freed.append(args[0])
            continue
        if name in GETTERS:
            if got != GETTERS[name]:
                print(f"FAIL {name} = {got}")
                return 1
            continue
        if got not in CODES:
            print(f"FAIL {name}{tuple(args)} = {got}")
            return 1
        if got == 0:  # collect what an out-parameter received
            made += 1
            level8[1] += since(name) is FeatureLevel.AIDL_V4
            for p, a in zip(params, args):
                if p.count("*") == 2 and a:
                    h = ctypes.c_void_p.from_address(a).value
                    if h and h not in live:
                        live.append(h)
    print(f"calls {calls} ok {made} handles {len(live)} freed {len(freed)} "
          f"level8 {level8[0]} ok {level8[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
