"""ai-edge-litert as the oracle of what a .tflite may be: each file is handed to its
Interpreter (construction and allocate_tensors) in a child process, since a hostile file can
crash it; a crash or a hang counts as a refusal and the child starts again after it. The
Interpreter runs TFLite's builtin kernels without the default XNNPACK delegate: the rules
asked of nnhal are those of TFLite's reader, interpreter and kernels, not the narrower set
of what that delegate takes (it refuses, e.g., a per-channel int32 bias whose zero points
are not 0, which TFLite's kernels accept and ignore)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

_CHILD = r"""
import os, sys
from ai_edge_litert.interpreter import Interpreter, OpResolverType
plain = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
folder = sys.argv[1]
for name in sys.argv[2:]:
    print("start", name, flush=True)
    with open(os.path.join(folder, name), "rb") as f:
        data = f.read()
    try:
        Interpreter(model_content=data, experimental_op_resolver_type=plain).allocate_tensors()
        verdict = "ok"
    except Exception as e:
        verdict = "refused " + " ".join(str(e).split())[:200]
    print("done", name, verdict, flush=True)
"""


def available() -> bool:
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError:
        return False
    return True


def verdicts(files: Sequence[bytes], budget_s: float = 60.0) -> list[str]:
    """One verdict per file: "ok", "refused <message>", "crash" or "hang"."""
    out: list[str | None] = [None] * len(files)
    deadline = time.monotonic() + budget_s
    with tempfile.TemporaryDirectory() as folder:
        for k, data in enumerate(files):
            with open(os.path.join(folder, str(k)), "wb") as f:
                f.write(data)
        todo = list(range(len(files)))
        while todo:
            left = deadline - time.monotonic()
            if left <= 0:
                for k in todo:
                    out[k] = "hang"
                break
            try:
                done = subprocess.run([sys.executable, "-c", _CHILD, folder,
                                       *map(str, todo)], capture_output=True, text=True,
                                      timeout=left).stdout
            except subprocess.TimeoutExpired as e:
                done = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (
                    e.stdout or "")
            started = None
            for line in done.splitlines():
                parts = line.split(" ", 2)
                if parts[0] == "start":
                    started = int(parts[1])
                elif parts[0] == "done":
                    out[int(parts[1])] = parts[2]
                    started = None
            if started is not None and out[started] is None:
                out[started] = "crash" if time.monotonic() < deadline else "hang"
            todo = [k for k in todo if out[k] is None]
            if todo and started is None:  # the child died before starting the next
                out[todo[0]] = "crash"
                todo = todo[1:]
    return [v or "hang" for v in out]
