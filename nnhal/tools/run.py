"""``nnhal run MODEL``: run a model once and summarise its outputs.

Without ``--device`` the model goes where ``Session(path)`` puts it: through the runtime over
every available device, which gives each operation to the fastest device that supports it;
one line says which devices ran what (:func:`ran_on`). ``--device NAME`` pins one driver.

Inputs come from an .npz (keys: the input names, or ``arr_0``... in input order; read by
:mod:`nnhal.tools.npz`, no further than the model's inputs need) or are random, of each
input's dtype and shape, and said to be so. Errors are one line on stderr,
``nnhal run: <message>``: exit 2 for arguments that cannot be used (checked as they are
parsed: files, device, seed) and inputs that do not fit the model (wrong keys, dtype or
shape), 1 for a model or device that fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from nnhal.conformance.cliutil import device, input_file, int_in, output_file
from nnhal.errors import InputError, ModelFileError, NnhalError, one_line
from nnhal.session import Session, TensorInfo
from nnhal.session.session import ModelSource
from nnhal.tools.npz import ArgumentProblem, read_feeds

#: Integer inputs that are not quantized (indices, sizes) get values in [0, SMALL_INT).
SMALL_INT = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=input_file, help="a .tflite model file")
    parser.add_argument("--inputs", metavar="IN.npz", type=input_file,
                        help="input arrays by input name (or arr_0... in order); "
                             "random inputs without it")
    parser.add_argument("--outputs", metavar="OUT.npz", type=output_file,
                        help="write the outputs here (this very name)")
    add_device_argument(parser)
    parser.add_argument("--seed", type=int_in(0, 2**64 - 1), default=0,
                        help="seed of the random inputs (default: 0)")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=device, default=None,
                        help="run on this one driver (remote:PATH for a service); default: "
                             "the runtime over every available device, which gives each "
                             "operation to the fastest device that supports it")


def read_model(path: str) -> ModelSource:
    """The model a command was given: its path, so that the Session reads it (or restores it
    from its content-keyed cache without reading it); a seam for the tests, which hand in HAL
    models."""
    return path


def open_session(path: str, device: str | None) -> Session:
    """The model prepared on ``device``, or (None) compiled by the runtime over every
    available device, as ``Session(path)`` does."""
    return Session(read_model(path), device)


def ran_on(session: Session) -> str:
    """Which devices ran what, in one line (the runtime's steps; ``nnhal info --plan`` has
    the rest), with the runtime's fallbacks to the reference driver when there were any."""
    from nnhal.tools.plan import placement

    comp = session.compilation
    line = placement(session.plan, pinned=comp is None)
    if comp is not None and comp.fell_back:
        line += "; the runtime fell back to the reference driver (the chosen device " \
                "failed to prepare the model)"
    if comp is not None and comp.fallbacks:
        line += f"; {comp.fallbacks} execution(s) fell back to the reference driver"
    return line


def fail(command: str, message: object, status: int) -> int:
    print(f"nnhal {command}: {message}", file=sys.stderr)
    return status


def console() -> Console:
    """Rich on a terminal; wide plain text otherwise (pipes, files, tests)."""
    c = Console(highlight=False)
    return c if c.is_terminal else Console(highlight=False, width=200, no_color=True)


# ---- inputs ---------------------------------------------------------------------------------

def concrete_shape(info: TensorInfo) -> tuple[tuple[int, ...], bool]:
    """The shape random inputs get: unknown dimensions (and an unknown rank) become 1."""
    if info.shape is None:
        return (1,), True
    return tuple(d or 1 for d in info.shape), 0 in info.shape


def random_array(info: TensorInfo, shape: tuple[int, ...], rng: np.random.Generator
                 ) -> np.ndarray:
    """Quantized integers over their type's whole range, floats standard normal, booleans
    fair, other integers in [0, SMALL_INT) (they are usually indices or sizes)."""
    dt = info.dtype
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if info.scale > 0 or dt.itemsize < 4:
        ii = np.iinfo(dt)
        return rng.integers(ii.min, ii.max, shape, dtype=dt, endpoint=True)
    return rng.integers(0, SMALL_INT, shape).astype(dt)


def random_feeds(inputs: Sequence[TensorInfo], seed: int) -> tuple[dict[str, np.ndarray],
                                                                   list[str]]:
    """Random feeds and the notes to print about them (the seed, unknown dimensions)."""
    rng = np.random.default_rng(seed)
    feeds, notes = {}, [f"inputs are random (seed {seed})"]
    for info in inputs:
        shape, guessed = concrete_shape(info)
        if guessed:
            notes.append(f"input '{info.name}': unknown dimensions set to 1, shape {shape}")
        feeds[info.name] = random_array(info, shape, rng)
    return feeds, notes


def load_feeds(path: str, inputs: Sequence[TensorInfo]) -> dict[str, np.ndarray]:
    """The arrays of an .npz as feeds by input name; ArgumentProblem naming what does not
    fit (see :mod:`nnhal.tools.npz`)."""
    return read_feeds(path, inputs)


# ---- outputs --------------------------------------------------------------------------------

def _number(v: object) -> str:
    if isinstance(v, (complex, np.complexfloating)):
        return f"{v.real:.6g}{v.imag:+.6g}j"
    return f"{v:.6g}" if isinstance(v, (float, np.floating)) else str(v)


def summary_table(outputs: dict[str, np.ndarray], title: str = "outputs") -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("name", "shape", "dtype", "min", "max", "mean", "first values"):
        table.add_column(col, justify="right" if col in ("min", "max", "mean") else "left")
    for name, arr in outputs.items():
        if arr.size:
            flat = arr.reshape(-1)
            # Complex values (an extension's complex64) have no order: their magnitudes'.
            ordered = np.abs(flat) if flat.dtype.kind == "c" else flat
            stats = [_number(ordered.min()), _number(ordered.max()),
                     _number(float(ordered.astype(np.float64).mean()))]
            if flat.dtype.kind == "c":
                stats = [f"|z| {v}" for v in stats]
            first = ", ".join(_number(v) for v in flat[:4].tolist())
            first += ", ..." if flat.size > 4 else ""
        else:
            stats, first = ["-", "-", "-"], "(empty)"
        table.add_row(name, str(tuple(arr.shape)), str(arr.dtype), *stats, first)
    return table


# ---- the command ----------------------------------------------------------------------------

def main(args: argparse.Namespace) -> int:
    out = console()
    try:
        session = open_session(args.model, args.device)
    except NnhalError as e:  # a file that cannot be read is a usage error, as for info/view
        return fail("run", e, 2 if isinstance(e, ModelFileError) else 1)
    with session:
        try:
            if args.inputs:
                feeds = load_feeds(args.inputs, session.inputs)
            else:
                feeds, notes = random_feeds(session.inputs, args.seed)
                for note in notes:
                    out.print(note)
            started = time.perf_counter()
            results = session.run(feeds)
            execute = time.perf_counter() - started
        except (ArgumentProblem, InputError) as e:
            return fail("run", e, 2)
        except NnhalError as e:
            return fail("run", e, 1)
        out.print(summary_table(results))
        out.print(f"{ran_on(session)}: prepare {session.prepare_seconds * 1e3:.2f} ms, "
                  f"execute {execute * 1e3:.3f} ms")
        if args.outputs:
            try:  # a file object: numpy would add .npz to a name that lacks it
                with open(args.outputs, "wb") as f:
                    np.savez(f, **results)
            except (OSError, ValueError) as e:
                return fail("run", f"cannot write {args.outputs}: {one_line(e)}", 1)
            out.print(f"outputs written to {args.outputs}")
    return 0
