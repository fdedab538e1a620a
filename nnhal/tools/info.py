"""``nnhal info MODEL``: what a model holds and where it can run.

:func:`model_info` gathers everything as plain data (what ``--json`` prints and the tests
check); :func:`render` draws it as rich tables for a person.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

from nnhal.analysis import about
from nnhal.conformance.cliutil import device, input_file
from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import ErrorStatus, Model, Operand, OperandType, is_extension_type
from nnhal.tflite.model import ImportedModel
from nnhal.tools.describe import (
    CONSTANT,
    Analysed,
    analysed,
    element_count,
    op_name,
    open_model,
    quant_text,
    shape_text,
    type_name,
)

#: A device to ask, or the reason it is not available.
DeviceOrReason = IDevice | str


def _tensor(a: Analysed, index: int, name: str, state: bool) -> dict[str, Any]:
    o: Operand = a.model.main.operands[index]
    t = OperandType(o.type) if o.type in OperandType._value2member_map_ else None
    shape = a.shape(-1, index)
    return {"name": name, "operand": index,
            "type": type_name(o.type, a.model.extension_name_to_prefix),
            "dtype": str(t.dtype) if t is not None else None, "shape": shape,
            "shape_text": shape_text(shape), "scale": o.scale, "zero_point": o.zero_point,
            "quantization": quant_text(o), "state": state}


def _constants(model: Model) -> tuple[int, int, int]:
    """(parameters: elements of constant tensors, constant bytes, constant operands)."""
    params = nbytes = count = 0
    for sg in [model.main, *model.referenced]:
        for o in sg.operands:
            if o.lifetime in CONSTANT:
                count += 1
                nbytes += o.location.length
                if o.type in OperandType._value2member_map_ and OperandType(o.type).is_tensor:
                    params += element_count(list(o.dimensions))
    return params, nbytes, count


def device_support(model: Model, devices: Mapping[str, DeviceOrReason],
                   problem: str | None = None) -> list[dict[str, Any]]:
    """Each device's answer to getSupportedOperations: supported count, and the unsupported
    operations by index and type; a device that refuses the model says why (``problem``:
    the validation message, which the HAL status alone does not carry)."""
    ops = model.main.operations
    table = model.extension_name_to_prefix
    out = []
    for name, dev in devices.items():
        entry: dict[str, Any] = {"name": name, "available": not isinstance(dev, str),
                                 "total": len(ops)}
        if isinstance(dev, str):
            entry["reason"] = dev
            out.append(entry)
            continue
        try:
            status, flags = dev.get_supported_operations(model)
        except Exception as e:  # noqa: BLE001 - a driver crash is reported, not raised
            status, flags = None, []
            entry["error"] = f"getSupportedOperations raised {type(e).__name__}: {e}"
        if status is not None and status != ErrorStatus.NONE:
            entry["error"] = f"getSupportedOperations: {ErrorStatus(status).name}" + \
                (f" ({problem})" if problem else "")
        if "error" not in entry and len(flags) != len(ops):
            entry["error"] = (f"getSupportedOperations gave {len(flags)} answers for "
                              f"{len(ops)} operations")
        if "error" in entry:
            entry["supported"] = None
            entry["unsupported"] = []
        else:
            entry["supported"] = sum(bool(f) for f in flags)
            table = model.extension_name_to_prefix
            entry["unsupported"] = [{"index": k, "type": op_name(ops[k].type, table)}
                                    for k, f in enumerate(flags) if not f]
            entry["flags"] = [bool(f) for f in flags]
        out.append(entry)
    return out


def model_info(imported: ImportedModel | Model,
               devices: Mapping[str, DeviceOrReason] | None = None) -> dict[str, Any]:
    """Everything ``nnhal info`` shows, as JSON-ready data. ``devices`` defaults to every
    device of :mod:`nnhal.drivers.registry` (opened for the question, then closed)."""
    a = analysed(imported)
    imp, model = a.imported, a.model
    main = model.main
    state_in = {s.input for s in imp.state}
    state_out = {s.output for s in imp.state}
    inputs = [_tensor(a, i, imp.input_names[k], k in state_in)
              for k, i in enumerate(main.input_indexes)]
    outputs = [_tensor(a, i, imp.output_names[k], k in state_out)
               for k, i in enumerate(main.output_indexes)]
    sgs = [main, *model.referenced]
    table = model.extension_name_to_prefix
    counts = Counter(op_name(op.type, table) for sg in sgs for op in sg.operations)
    params, nbytes, nconst = _constants(model)
    info: dict[str, Any] = {
        "source": imp.source,
        "valid": a.problem is None,
        "problem": a.problem,
        "relaxed": bool(getattr(model, "relax_computation_float32_to_float16", False)),
        "inputs": inputs,
        "outputs": outputs,
        "operations": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "operation_count": sum(counts.values()),
        "parameters": params,
        # The analysis' estimate of one execution (multiply-adds or element visits; what
        # a device's max_work bounds); None for an invalid model.
        "work": None if a.graph is None else a.graph.work,
        "constant_bytes": nbytes,
        "constants": nconst,
        "subgraphs": [{"index": k - 1, "name": "main" if k == 0 else f"subgraph {k - 1}",
                       "operations": len(sg.operations), "operands": len(sg.operands),
                       "inputs": len(sg.input_indexes), "outputs": len(sg.output_indexes)}
                      for k, sg in enumerate(sgs)],
        "state": [{"name": s.name, "shape": list(s.initial.shape), "dtype": str(s.initial.dtype),
                   "input": s.input, "output": s.output} for s in imp.state],
    }
    opened: list[IDevice] = []
    registry = devices is None
    if devices is None:
        devices, opened = registry_devices()
    try:
        info["devices"] = device_support(model, devices, a.problem)
        if registry and a.problem is None:
            info["runtime"] = runtime_placement(model, devices)
        info["extension_operations"] = extension_operations(model, info["devices"],
                                                            a.problem is None)
    finally:
        for dev in opened:
            close = getattr(dev, "close", None)
            if close is not None:
                close()
    for d in info["devices"]:
        d.pop("flags", None)
    return info


def runtime_placement(model: Model, devices: Mapping[str, DeviceOrReason]) -> dict[str, Any]:
    """Where the runtime would run each operation over the available ``devices`` (their
    capabilities and supported operations; nothing is prepared): ``steps`` (device and
    operations each), or ``problem``. Preparing can still fall back (``nnhal info --plan``
    compiles for real)."""
    from nnhal.runtime.codes import PreferenceCode
    from nnhal.runtime.devices import Device
    from nnhal.runtime.partition import RUNTIME, NoDevice, assign, group

    try:
        candidates = [Device(name, d) for name, d in devices.items() if not isinstance(d, str)]
        if not candidates:
            return {"problem": "no device is available"}
        choice = assign(model, candidates, int(PreferenceCode.FAST_SINGLE_ANSWER))
        runs = group(model, choice)
    except NoDevice as e:
        return {"problem": f"no device supports operations {e.operations}"}
    except Exception as e:  # noqa: BLE001 - a driver that answers wrongly: said, not raised
        return {"problem": f"{type(e).__name__}: {e}"}
    return {"steps": [{"device": "runtime" if d == RUNTIME else candidates[d].name,
                       "operations": ops} for d, ops in runs]}


def extension_operations(model: Model, support: list[dict[str, Any]], plan: bool = True
                         ) -> list[dict[str, Any]]:
    """Each main operation of a vendor extension: its name, its extension, the devices that
    support it and (``plan``: the runtime's partition over every available device) the one
    that runs it."""
    table = model.extension_name_to_prefix
    prefixes = {int(e.prefix): e.name for e in table}
    found = [k for k, op in enumerate(model.main.operations) if is_extension_type(op.type)]
    if not found:
        return []
    runs_on: dict[int, str] = {}
    why = None
    if plan:
        from nnhal.tools.plan import compile_plan, operation_devices

        try:
            steps, comp = compile_plan(model)
            comp.free()
            runs_on = operation_devices(steps)
        except NnhalError as e:
            why = str(e)
    out = []
    for k in found:
        t = int(model.main.operations[k].type)
        entry = {"index": k, "operation": op_name(t, table),
                 "extension": prefixes.get(t >> 16),
                 "supported_by": [d["name"] for d in support
                                  if d.get("flags") and k < len(d["flags"]) and d["flags"][k]],
                 "runs_on": runs_on.get(k)}
        if why is not None:
            entry["plan_problem"] = why
        out.append(entry)
    return out


def registry_devices() -> tuple[dict[str, DeviceOrReason], list[IDevice]]:
    """Every registered device: opened when available, else the reason it is not."""
    from nnhal.drivers import registry  # type: ignore[attr-defined]

    devices: dict[str, DeviceOrReason] = {}
    opened: list[IDevice] = []
    for name, reason in registry.available().items():
        if reason is not None:
            devices[name] = reason
            continue
        try:
            dev = registry.open_device(name)
        except NnhalError as e:
            devices[name] = str(e)
            continue
        devices[name] = dev
        opened.append(dev)
    return devices, opened


# ---- rendering ------------------------------------------------------------------------------

def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render(info: dict[str, Any], console: Any = None) -> None:
    """The info as tables on ``console`` (a rich Console; stdout by default)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:  # a pipe or file gets lines as wide as a terminal's would be
        console = Console() if sys.stdout.isatty() else Console(width=120)
    title = info["source"] or "model"
    console.print(f"[bold]{title}[/bold]: {info['operation_count']} operations, "
                  f"{info['parameters']:,} parameters, {_size(info['constant_bytes'])} of "
                  f"constants" + (" (float32 relaxed to float16)" if info["relaxed"] else "")
                  + ("" if info["work"] is None else
                     f", work ~{about(info['work'], 2)} a run"),
                  highlight=False)
    if info["problem"]:
        console.print(f"[red]invalid model[/red]: {info['problem']}", highlight=False)
    for label, rows in (("inputs", info["inputs"]), ("outputs", info["outputs"])):
        table = Table(title=label, title_justify="left", show_edge=False)
        for col in ("#", "name", "type", "shape", "quantization"):
            table.add_column(col, overflow="fold")
        for k, r in enumerate(rows):
            name = r["name"] + (" (state)" if r["state"] else "")
            table.add_row(str(k), name, r["type"].removeprefix("TENSOR_"), r["shape_text"],
                          r["quantization"])
        console.print(table)
    ops = Table(title="operations", title_justify="left", show_edge=False)
    ops.add_column("type")
    ops.add_column("count", justify="right")
    for name, n in info["operations"].items():
        ops.add_row(name, str(n))
    console.print(ops)
    if len(info["subgraphs"]) > 1:
        sg = Table(title="subgraphs", title_justify="left", show_edge=False)
        for col in ("subgraph", "operations", "operands", "inputs", "outputs"):
            sg.add_column(col, justify="left" if col == "subgraph" else "right")
        for s in info["subgraphs"]:
            sg.add_row(s["name"], str(s["operations"]), str(s["operands"]), str(s["inputs"]),
                       str(s["outputs"]))
        console.print(sg)
    if info["state"]:
        st = Table(title="state variables (an extra input and output each)",
                   title_justify="left", show_edge=False)
        for col in ("name", "shape", "dtype", "input", "output"):
            st.add_column(col)
        for s in info["state"]:
            st.add_row(s["name"], shape_text(s["shape"]), s["dtype"], str(s["input"]),
                       str(s["output"]))
        console.print(st)
    if info.get("extension_operations"):
        ext = Table(title="extension operations (vendor extensions: not HAL operations)",
                    title_justify="left", show_edge=False)
        for col in ("#", "operation", "extension", "supported by", "runs on"):
            ext.add_column(col, overflow="fold")
        for e in info["extension_operations"]:
            ext.add_row(str(e["index"]), e["operation"], e["extension"] or "?",
                        ", ".join(e["supported_by"]) or "no device",
                        e["runs_on"] or ("not planned" if "plan_problem" not in e
                                         else "no plan: " + e["plan_problem"]))
        console.print(ext)
    console.print("[bold]devices[/bold]", highlight=False)
    for d in info.get("devices", []):
        console.print("  " + device_line(d), highlight=False, markup=False)
    runtime = info.get("runtime")
    if runtime is not None:
        from nnhal.tools.plan import placement

        where = runtime.get("problem") or placement(runtime["steps"], verb="runs on")
        console.print(f"  runtime (the default, over every available device): {where}; "
                      f"nnhal info --plan for its steps", highlight=False, markup=False)


def device_line(d: dict[str, Any]) -> str:
    """``reference: 64/64 supported`` or the unsupported operations, or why not asked."""
    if not d["available"]:
        return f"{d['name']}: not available ({d['reason']})"
    if d.get("error"):
        return f"{d['name']}: {d['error']}"
    line = f"{d['name']}: {d['supported']}/{d['total']} supported"
    if d["unsupported"]:
        shown = ", ".join(f"#{u['index']} {u['type']}" for u in d["unsupported"][:20])
        more = len(d["unsupported"]) - 20
        line += f"; not: {shown}" + (f" and {more} more" if more > 0 else "")
    return line


# ---- command --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=input_file, help="a .tflite file")
    parser.add_argument("--json", action="store_true", help="print the information as JSON")
    parser.add_argument("--plan", action="store_true",
                        help="the runtime's partition: which device runs which operations")
    parser.add_argument("--device", action="append", metavar="NAME", type=device,
                        help="with --plan: partition over these devices (repeatable; default: "
                             "every available device)")
    parser.add_argument("--preference", choices=["fast", "sustained", "low-power"],
                        default="fast", help="with --plan: the compilation's preference")


def plan_info(imported: ImportedModel | Model, device_names: list[str] | None = None,
              preference: str = "fast") -> list[dict[str, Any]]:
    """The runtime's steps, each with its operations' names and, per operation some device
    refused (``refused``), why each of those devices refused it."""
    from nnhal.tools.plan import compile_plan, refusals

    model = imported.model if isinstance(imported, ImportedModel) else imported
    steps, comp = compile_plan(model, device_names, preference)
    try:
        refused = refusals(model, comp)
    finally:
        comp.free()
    for s in steps:
        s["operation_names"] = [op_name(model.main.operations[k].type,
                                        model.extension_name_to_prefix)
                                for k in s["operations"]]
        s["refused"] = [{"index": k, "operation": name, "devices": refused[k]}
                        for k, name in zip(s["operations"], s["operation_names"])
                        if k in refused]
    return steps


def render_plan(steps: list[dict[str, Any]]) -> None:
    print(f"plan: {len(steps)} step{'s' if len(steps) != 1 else ''}")
    for k, s in enumerate(steps):
        names = Counter(s["operation_names"])
        ops = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in names.items())
        print(f"  step {k}: {s['device']}: {len(s['operations'])} operations "
              f"{_ranges(s['operations'])} ({ops}); inputs {s['inputs']}, "
              f"outputs {s['outputs']}")
        for r in s.get("refused", []):
            why = "; ".join(f"{d} refused it: {reason}" for d, reason in r["devices"].items())
            print(f"    #{r['index']} {r['operation']} runs on {s['device']}: {why}")


def _ranges(xs: list[int]) -> str:
    out, start = [], None
    for k, x in enumerate(xs):
        if start is None:
            start = x
        if k + 1 == len(xs) or xs[k + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return "[" + ", ".join(out) + "]"


def main(args: argparse.Namespace) -> int:
    imported = open_model(args.model)
    if args.plan:
        steps = plan_info(imported, args.device, args.preference)
        if args.json:
            json.dump({"plan": steps}, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            render_plan(steps)
        return 0
    info = model_info(imported)
    if args.json:
        json.dump(info, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        render(info)
    return 0
