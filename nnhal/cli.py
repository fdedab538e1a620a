"""The ``nnhal`` command: ``run``, ``info``, ``bench`` and ``view`` a model file; ``demo``,
``ops``, ``conformance``, ``mutations``, ``serve`` and ``services``.

Every subcommand is imported only when it runs, so that ``nnhal --help`` loads no numpy. An
error a user can act on (any :class:`~nnhal.errors.NnhalError`, a bad argument) is one line
on stderr, ``nnhal <command>: <message>``, never a traceback.
"""

from __future__ import annotations

import argparse
import codecs
import importlib
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

#: The modes of ``nnhal conformance`` (nnhal.conformance.runner.MODES, checked by a test),
#: here so that arguments are checked before numpy and the driver load.
MODES = ("general", "dynamic_shape", "quantization_coupling", "memory_domain", "fenced",
         "caching", "runtime", "partitioned", "capi")

#: The model commands, each a module ``nnhal.tools.<name>`` with ``add_arguments(parser)``
#: and ``main(args) -> int``, imported only when it is the command given.
TOOLS = {
    "run": "run a model file on a device, with given or random inputs",
    "info": "a model's inputs, outputs, operations, parameters and device support",
    "bench": "time a model on a device: prepare time, latency, executions per second",
    "view": "draw a model's graph as an HTML page, SVG or Graphviz DOT",
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``nnhal info: ...``), not usage plus error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _conformance(args: argparse.Namespace) -> int:
    from nnhal.conformance.cliutil import error, parse_shard, writable_problem
    from nnhal.conformance.specs import default_specs_dir, no_cases_message, specs_problem

    prog = "nnhal conformance"
    modes = args.mode or ["general"]
    for m in modes:
        if m not in MODES:
            return error(prog, f"unknown mode {m!r}; modes: {', '.join(MODES)}")
    worker = args.shard is not None  # one shard of a --jobs run (see parallel.py)
    shard = parse_shard(args.shard or "0/1")
    if shard is None:
        return error(prog, f"--shard must be K/N with 0 <= K < N, not {args.shard!r}")
    if worker and not args.json:
        return error(prog, "--shard needs --json (the shard's report)")
    specs = Path(args.specs) if args.specs else default_specs_dir()
    problem = specs_problem(specs)
    if problem:
        return error(prog, problem)
    if args.json:
        problem = writable_problem(Path(args.json))
        if problem:
            return error(prog, f"cannot write --json {args.json}: {problem}")
    from nnhal.conformance.faces import DEFAULT_FACE
    from nnhal.conformance.faces import problem as face_problem

    problem = face_problem(args.hal)
    if problem:
        return error(prog, f"--hal {args.hal}: {problem}")

    from nnhal.conformance import Options, iter_cases, run
    from nnhal.drivers import registry
    from nnhal.drivers.registry import open_device
    from nnhal.errors import NnhalError

    if not registry.lookup(args.device):
        return error(prog, f"unknown device '{args.device}'; devices: "
                           f"{', '.join(registry.device_names())}")
    why = registry.reason(args.device)
    if why is not None:
        return error(prog, f"device '{args.device}' is not available: {why}")
    if "partitioned" in modes and not worker:
        from nnhal.conformance.mode_partitioned import describe

        print(describe(), file=sys.stderr)
    if args.runtime_create and args.hal != DEFAULT_FACE and not worker:
        print(f"runtime: --runtime-create compiles with plain create over the runtime's own "
              f"devices, which do not go through --hal {args.hal} (createForDevices does)",
              file=sys.stderr)
    if args.jobs > 1 and not worker:
        from nnhal.conformance.parallel import ShardFailed, run_sharded

        try:
            report = run_sharded(specs, modes, args.jobs, args.filter, args.loop_timeout_ms,
                                 args.device, ["--hal", args.hal] +
                                 (["--runtime-create"] if args.runtime_create else []))
        except ShardFailed as e:
            return error(prog, str(e), 1)
    else:
        cases = list(iter_cases(specs, args.filter, shard))
        if not cases and not worker:
            return error(prog, no_cases_message(specs, args.filter))
        opts = Options(loop_timeout_ns=int(args.loop_timeout_ms * 1_000_000),
                       runtime_create=args.runtime_create, face=args.hal)
        try:
            device = open_device(args.device)
        except NnhalError as e:
            return error(prog, str(e))
        if "capi" in modes:  # the C library must list the device too (remote:PATH: named)
            from nnhal.conformance.faces import library_name

            why = _capi_device_problem(library_name(args.hal,
                                                    getattr(device, "name", args.device)))
            if why is not None:
                device.close()
                return error(prog, why)
        try:
            report = run(device, cases, modes, opts, progress=not args.quiet)
        finally:
            device.close()
    if worker:
        Path(args.json).write_text(json.dumps(report.to_json()))
        return 0
    if not report.cases:
        return error(prog, no_cases_message(specs, args.filter))
    if args.show_failures:
        for c in report.cases:
            if c["result"] == "failed":
                print(f"FAIL [{c['mode']}] {c['file']} {c['name']}: {c['message']}")
    print(report.summary(show_ops=not args.no_ops))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
        except OSError as e:
            return error(prog, f"cannot write --json {args.json}: {e.strerror or e}", 1)
    if report.broken:
        return error(prog, f"{len(report.broken)} case(s) could not be loaded or built; "
                           f"they are listed above and counted as failed", 1)
    from nnhal.conformance.runner import DEVICE_DIED

    unavailable = sum(c["result"] == "failed" and any(
        m in c["message"] for m in ("DEVICE_UNAVAILABLE", "DEAD_OBJECT", DEVICE_DIED))
        for c in report.cases)
    if unavailable or report.died:  # the device went away (a service that died): the run
        # is not a verdict
        return error(prog, f"{unavailable} case(s) failed because device '{args.device}' "
                           f"became unavailable" + (" (it died)" if report.died else ""), 1)
    failed = sum(c["failed"] for c in report.to_json()["modes"].values())
    return 1 if failed and args.strict else 0


def _capi_device_problem(name: str) -> str | None:
    """None when libneuralnetworks.so lists device ``name`` (or is made to), else why not."""
    try:
        from nnhal.capi import ctypes_ndk

        return ctypes_ndk.use_device(name)
    except OSError as e:  # the library cannot be built or loaded
        return f"mode capi: {e}"


def _mutations(args: argparse.Namespace) -> int:
    from nnhal.conformance.mutations import run_cli

    return run_cli(args)


def _tflite_table() -> str:
    """Every TFLite builtin with how the importer handles it, and the count of each kind."""
    from collections import Counter

    from nnhal.tflite import builtin_table, custom_support

    table = builtin_table()
    width = max(len(n) for n in table)
    kw = max(len(k) for k, _ in table.values())
    lines = [f"{name:<{width}}  {kind:<{kw}}  {note}" for name, (kind, note) in table.items()]
    # An extension's operation counts as "extension" ("extension (NAME:OP)" in the table).
    counts = Counter("extension" if kind.startswith("extension (") else kind
                     for kind, _ in table.values())
    lines.append("")
    lines.append(", ".join(f"{k}: {counts[k]}" for k in ("HAL operation", "lowered", "folded",
                                                          "extension", "refused"))
                 + f" ({len(table)} builtins)")
    for code, note in custom_support().items():
        lines.append(f"custom {code}: {note}")
    return "\n".join(lines)


def _ops(args: argparse.Namespace) -> int:
    from nnhal.ops import docs

    if args.tflite:
        print(_tflite_table())
        return 0
    if args.markdown:
        sys.stdout.write(docs.markdown())
        return 0
    if args.extensions:
        from nnhal.ops import extensions

        print(extensions.describe())
        return 0
    try:
        print(docs.text(args.names))
    except KeyError as e:
        print(f"nnhal ops: {e.args[0]}", file=sys.stderr)
        return 2
    return 0


def _serve_types() -> dict:
    """The argparse types of ``nnhal serve``'s bounds (options and their environment)."""
    from nnhal.conformance.cliutil import float_in, int_in

    return {"partial_s": float_in(0.001, 1e6), "min_rate": float_in(1, 1e12),
            "max_held": int_in(1, 1 << 50)}


def _serve(args: argparse.Namespace) -> int:
    import logging

    from nnhal.conformance.cliutil import error
    from nnhal.service.server import LIMIT_ENV, Limits, serve

    given = {}
    for field, env in LIMIT_ENV.items():
        value = getattr(args, field)
        if value is None and os.environ.get(env):
            try:
                value = _serve_types()[field](os.environ[env])
            except argparse.ArgumentTypeError as e:
                return error("nnhal serve", f"{env}: {e}")
        if value is not None:
            given[field] = value
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="nnhal serve: %(message)s")
    try:
        return serve(args.driver, args.socket, args.runtime_dir, args.group, args.name,
                     limits=Limits(**given))
    except OSError as e:
        print(f"nnhal serve: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              file=sys.stderr)
        return 1


def _services(args: argparse.Namespace) -> int:
    from nnhal.service import registration

    directory = registration.runtime_dir(args.runtime_dir)
    if directory is None:
        print("nnhal services: no runtime directory ($XDG_RUNTIME_DIR unset; give "
              "--runtime-dir)", file=sys.stderr)
        return 1
    entries, others = registration.scan(directory)
    if not entries:
        print(f"no services registered in {directory}")
    for e in entries:
        print(f"remote:{e.name}  driver={e.driver}  pid={e.pid}  socket={e.socket}  "
              f"{e.state()}")
    for fname, why in others:
        print(f"{fname}  not a service: {why}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from nnhal.demo import main as demo_main

    return demo_main()


def _ndk(args: argparse.Namespace) -> int:
    from nnhal.capi.build import INCLUDE_DIR, library_dir

    if args.includedir:
        print(INCLUDE_DIR)
        return 0
    d, why = library_dir()
    if d is None:
        print(f"nnhal ndk: no libneuralnetworks.so: {why}", file=sys.stderr)
        return 1
    print(d)
    return 0


def _add_tool(sub: argparse._SubParsersAction, name: str, selected: bool) -> None:
    p = sub.add_parser(name, help=TOOLS[name], description=TOOLS[name])
    if not selected:  # its arguments matter only when it runs
        return
    try:
        module = importlib.import_module(f"nnhal.tools.{name}")
    except ImportError as e:
        p.exit(1, f"nnhal {name}: cannot load nnhal.tools.{name}: {e}\n")
    module.add_arguments(p)
    p.set_defaults(func=module.main)


def _tool_failed(command: str, e: BaseException) -> int:
    from nnhal.errors import ModelFileError

    status = 2 if isinstance(e, ModelFileError) else 1
    print(f"nnhal {command}: {e}", file=sys.stderr)
    return status


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The parser, with the arguments of the model command ``argv`` names (only that one is
    imported)."""
    from nnhal.conformance.cliutil import (
        add_hal_argument,
        add_mutations_arguments,
        float_in,
        int_in,
    )

    parser = _Parser(prog="nnhal", description="The Android Neural Networks HAL 1.3 in Python: "
                     "run, inspect, time and draw .tflite models; check a driver against the "
                     "upstream conformance cases.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in TOOLS:
        _add_tool(sub, name, selected=bool(argv) and argv[0] == name)

    d = sub.add_parser("demo", help="build, prepare and run a small convolutional model")
    d.set_defaults(func=_demo)

    o = sub.add_parser("ops", help="the operations nnhal runs: inputs, outputs, types, versions")
    o.add_argument("names", nargs="*", help="operations to show in full (e.g. CONV_2D)")
    o.add_argument("--markdown", action="store_true",
                   help="the whole reference as Markdown (docs/operations.md)")
    o.add_argument("--tflite", action="store_true",
                   help="every TFLite builtin and how the importer handles it (HAL "
                        "operation, lowered, folded, refused), with the counts")
    o.add_argument("--extensions", action="store_true",
                   help="the installed vendor extensions (entry points nnhal.extensions)")
    o.set_defaults(func=_ops)

    c = sub.add_parser("conformance", help="run the upstream conformance cases")
    c.add_argument("--specs", help="folder of cases (default: $NNHAL_CONFORMANCE or "
                                   "../shared/conformance)")
    c.add_argument("--mode", action="append",
                   help=f"{', '.join(MODES)} (repeatable; default general)")
    c.add_argument("--filter", help="fnmatch pattern on case names, e.g. 'conv2d*'")
    c.add_argument("--json", help="write the full report to this file")
    c.add_argument("--loop-timeout-ms", type=float_in(0, 15_000), default=500.0,
                   help="WHILE loop timeout of the cases expected to fail, the endless "
                        "loops (default 500, at most 15000; cases expected to pass get at "
                        "least 2000)")
    c.add_argument("--show-failures", action="store_true", help="print every failed case")
    c.add_argument("--no-ops", action="store_true", help="omit the per-operation lines")
    c.add_argument("--strict", action="store_true", help="exit 1 if any case failed")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.add_argument("--jobs", type=int_in(1, 256), default=1,
                   help="run in this many processes (each opens the device)")
    c.add_argument("--device", default="reference",
                   help="device to check (a registered name, e.g. litert; default: reference)")
    add_hal_argument(c)
    c.add_argument("--runtime-create", action="store_true",
                   help="mode runtime: also compile with plain create over every available "
                        "device (besides createForDevices on --device)")
    c.add_argument("--shard", help=argparse.SUPPRESS)
    c.set_defaults(func=_conformance)

    n = sub.add_parser("ndk", help="where libneuralnetworks.so and NeuralNetworks.h are, for "
                       "C clients of the NNAPI")
    g = n.add_mutually_exclusive_group(required=True)
    g.add_argument("--libdir", action="store_true",
                   help="the folder of libneuralnetworks.so (built on first use from a "
                        "source tree)")
    g.add_argument("--includedir", action="store_true", help="the folder of NeuralNetworks.h")
    n.set_defaults(func=_ndk)

    sv = sub.add_parser("serve", help="serve a driver on a Unix socket (nnhal/service)")
    sv.add_argument("driver", help="the driver, as --device names it (e.g. reference)")
    sv.add_argument("--socket", help="socket path (default: RUNTIME_DIR/NAME.sock)")
    sv.add_argument("--runtime-dir", help="where services register (default: "
                                          "$NNHAL_RUNTIME_DIR or $XDG_RUNTIME_DIR/nnhal)")
    sv.add_argument("--name", help="the service's name (default: the driver's)")
    sv.add_argument("--group", help="also allow this group (socket 0660, else 0600)")
    sv.add_argument("--verbose", action="store_true", help="log each refused call")
    types = _serve_types()
    sv.add_argument("--partial-timeout", dest="partial_s", type=types["partial_s"],
                    help="seconds a message may go without a byte once it began; a client "
                         "that stops inside one is dropped (default: $NNHAL_SERVE_PARTIAL_S, "
                         "else 30)")
    sv.add_argument("--min-rate", dest="min_rate", type=types["min_rate"],
                    help="bytes/s a message must keep coming at after that (default: "
                         "$NNHAL_SERVE_MIN_RATE, else 65536)")
    sv.add_argument("--max-held", dest="max_held", type=types["max_held"],
                    help="bytes of incomplete message bodies held over all clients; a body "
                         "past it is refused RESOURCE_EXHAUSTED_TRANSIENT (default: "
                         "$NNHAL_SERVE_MAX_HELD, else 1073741824)")
    sv.set_defaults(func=_serve)

    ls = sub.add_parser("services", help="the driver services registered on this machine")
    ls.add_argument("--runtime-dir", help="the runtime directory to list")
    ls.set_defaults(func=_services)

    # `nnhal mutations`: invalid models/requests over the suite (nnhal/conformance/mutations/)
    mu = sub.add_parser("mutations", help="invalid models and requests derived from the cases")
    add_mutations_arguments(mu)
    mu.set_defaults(func=_mutations)
    return parser, sub


def _argv_problem(argv: list[object]) -> tuple[list[str], str | None]:
    """The arguments as text, and why one cannot be used: not text, or a NUL byte. A name
    that is not UTF-8 is a valid Linux path: it is kept as the OS decodes it (surrogate
    escapes), opens as the same bytes, and prints with backslash escapes."""
    texts: list[str] = []
    for k, a in enumerate(argv, 1):
        if isinstance(a, bytes):
            a = os.fsdecode(a)
        if not isinstance(a, str):
            return texts, f"argument {k} is a {type(a).__name__}, not text"
        if "\0" in a:
            return texts, f"argument {k} contains a NUL byte"
        texts.append(a)
    return texts, None


def _escaped(err: UnicodeError) -> tuple[str, int]:
    """Codec error handler: a byte the OS decoded as a surrogate escape (a file name that is
    not UTF-8) is shown as ``\\xNN``, anything else unencodable as a backslash escape, so
    the output stays valid text for whoever reads it."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    chunk = err.object[err.start:err.end]
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                   else c.encode("ascii", "backslashreplace").decode("ascii")
                   for c in chunk), err.end


def _printable_streams() -> None:
    """stdout and stderr never fail mid-line on what they cannot encode (a file name that is
    not UTF-8, in a message or a listing)."""
    codecs.register_error("nnhal.escaped", _escaped)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="nnhal.escaped")
            except (ValueError, OSError):  # a stream already written in another mode
                pass


def main(argv: list[str] | None = None) -> int:
    """The ``nnhal`` command; the exit status: 0, 1 for a run that failed, 2 for arguments
    that cannot be used (a one-line message on stderr either way, never a traceback)."""
    raw = sys.argv[1:] if argv is None else list(argv)
    _printable_streams()
    argv, problem = _argv_problem(raw)
    if problem is not None:
        prog = f"nnhal {argv[0]}" if argv and argv[0].isalpha() else "nnhal"
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    try:
        parser, sub = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        if extra:
            sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, or a usage error already printed in one line
        return e.code if isinstance(e.code, int) else 2
    from nnhal.errors import NnhalError

    try:
        return int(args.func(args))
    except BrokenPipeError:  # the reader went away (`nnhal ops | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except NnhalError as e:
        return _tool_failed(args.command, e)
    except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback on request
        if os.environ.get("NNHAL_DEBUG"):
            raise
        from nnhal.errors import one_line

        print(f"nnhal {args.command}: internal error ({one_line(e)}); please report it "
              f"(NNHAL_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
