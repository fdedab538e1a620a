"""The commands against hostile arguments and files: each kind is one line on stderr and exit
status 2 (an argument that cannot be used) or 1 (a run that failed), never a traceback, a
hang or an allocation the model never asked for; then a seeded fuzz over all of them."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import add_model

from nnhal import cli
from nnhal.tflite.model import ImportedModel
from nnhal.tools import run

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32
#: Seconds a command may take before it counts as hung (generous: a loaded 2-core machine).
BOUND = 60.0

MODELS = {
    "add.tflite": lambda: ImportedModel(add_model((2,)), ["a", "b"], ["sum"], [], "add.tflite"),
    "dynamic.tflite": lambda: ImportedModel(add_model((0, 3)), ["a", "b"], ["sum"], [],
                                            "dynamic.tflite"),
}


@pytest.fixture(autouse=True)
def fake_models(monkeypatch, tmp_path):
    """``add.tflite`` and ``dynamic.tflite`` in the current folder are these HAL models."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NNHAL_DEBUG", raising=False)
    for name in MODELS:
        (tmp_path / name).write_bytes(b"placeholder")
    real = run.read_model
    monkeypatch.setattr(run, "read_model",
                        lambda path: MODELS[path]() if path in MODELS else real(path))


def nnhal(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main([a if isinstance(a, bytes) else str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def one_line(status: int, err: str, want: int, *words: str) -> None:
    assert status == want, (status, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.count("\n") == 1 and err.startswith("nnhal"), err
    for w in words:
        assert w in err, (w, err)


def subprocess_nnhal(*argv) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *argv], cwd=ROOT,
                          capture_output=True, timeout=BOUND, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


# ---- .npz files ------------------------------------------------------------------------------

def npy(shape, descr="<f4", data=b"", fortran=False, version=(1, 0), header=None) -> bytes:
    text = header if header is not None else \
        f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {tuple(shape)}, }}"
    body = text.encode("latin1")
    body += b" " * (-(len(body) + 10 + (version[0] > 1) * 2 + 1) % 64) + b"\n"
    length = struct.pack("<H" if version == (1, 0) else "<I", len(body))
    return b"\x93NUMPY" + bytes(version) + length + body + data


def npz(path: Path, members: dict[str, bytes], compress: bool = False) -> Path:
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


B = npy((2,), data=np.ones(2, F32).tobytes())


def test_a_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path, capsys):
    bad = npz(tmp_path / "in.npz", {"a.npy": npy((1 << 40,)), "b.npy": B})
    status, _, err = nnhal(capsys, "run", "dynamic.tflite", "--inputs", bad)
    one_line(status, err, 2, "input 'a'")
    bad = npz(tmp_path / "in2.npz", {"a.npy": npy((1 << 40, 3)), "b.npy": B})
    status, _, err = nnhal(capsys, "run", "dynamic.tflite", "--inputs", bad)
    one_line(status, err, 2, "more than the")


def test_a_deflated_member_bigger_than_its_header_says_is_not_inflated(tmp_path, capsys):
    bomb = npy((2,), data=bytes(64 << 20))  # 64 MiB of zeros, about 64 KiB deflated
    bad = npz(tmp_path / "in.npz", {"a.npy": bomb, "b.npy": B}, compress=True)
    assert bad.stat().st_size < 1 << 20
    import tracemalloc

    tracemalloc.start()
    try:
        status, _, err = nnhal(capsys, "run", "add.tflite", "--inputs", bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(status, err, 2, "array 'a'", "needs 8")
    assert peak < 16 << 20, peak


@pytest.mark.parametrize("member, words", [
    (npy((2,), data=b"\0" * 5), "holds 5 bytes"),
    (npy((2,), header="{'descr': '<f4'"), "cannot be read"),
    (npy((2,), version=(2, 0))[:8] + struct.pack("<I", 1 << 31), "more than the"),
    (npy((2,), version=(3, 0)), "version 3.0"),
    (npy((2,), descr="|O"), "Python objects"),
    (npy((2,), descr="<f8", data=bytes(16)), "float64"),
    (npy((-1,)), "(-1,)"),
    (b"not an array", "not an .npy array"),
], ids=["truncated", "bad-header", "huge-header", "version", "object", "dtype", "negative",
        "not-npy"])
def test_broken_members_are_one_line(tmp_path, capsys, member, words):
    bad = npz(tmp_path / "in.npz", {"a.npy": member, "b.npy": B})
    status, _, err = nnhal(capsys, "run", "add.tflite", "--inputs", bad)
    one_line(status, err, 2, words)


def test_fortran_order_and_compressed_members_are_read(tmp_path, capsys):
    good = npz(tmp_path / "in.npz", {
        "a.npy": npy((2, 3), fortran=True, data=np.arange(6, dtype=F32).reshape(2, 3)
                     .T.tobytes()),
        "b.npy": npy((2, 3), data=np.ones((2, 3), F32).tobytes())}, compress=True)
    status, _, err = nnhal(capsys, "run", "dynamic.tflite", "--inputs", good, "--outputs",
                           "out")
    assert (status, err) == (0, "")
    with np.load("out", allow_pickle=False) as saved:  # the very name, no .npz added
        np.testing.assert_array_equal(saved["sum"], np.arange(6).reshape(2, 3) + 1)


def test_members_that_are_not_arrays_are_refused(tmp_path, capsys):
    bad = npz(tmp_path / "in.npz", {"a.npy": B, "b.npy": B, "notes.txt": b"hi"})
    status, _, err = nnhal(capsys, "run", "add.tflite", "--inputs", bad)
    one_line(status, err, 2, "notes.txt")


# ---- files -----------------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["model", "--inputs"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, option):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    argv = [str(fifo)] if option == "model" else [str(tmp_path / "m.tflite"), option, str(fifo)]
    (tmp_path / "m.tflite").write_bytes(b"junk")
    started = time.monotonic()
    done = subprocess_nnhal("run", *argv)
    err = done.stderr.decode()
    one_line(done.returncode, err, 2, "not a regular file")
    assert time.monotonic() - started < BOUND


def test_a_fifo_as_output_is_refused_without_waiting_for_a_reader(tmp_path):
    fifo = tmp_path / "out.npz"
    os.mkfifo(fifo)
    (tmp_path / "m.tflite").write_bytes(b"junk")
    done = subprocess_nnhal("run", str(tmp_path / "m.tflite"), "--outputs", str(fifo))
    one_line(done.returncode, done.stderr.decode(), 2, "FIFO")


@pytest.mark.parametrize("command", ["run", "info", "view", "bench"])
def test_a_directory_is_not_an_input(tmp_path, capsys, command):
    extra = ["-o", "g.html"] if command == "view" else []
    status, _, err = nnhal(capsys, command, tmp_path, *extra)
    one_line(status, err, 2, "is a directory")
    if command == "run":
        status, _, err = nnhal(capsys, "run", "add.tflite", "--inputs", tmp_path)
        one_line(status, err, 2, "is a directory")


def test_names_that_are_not_utf8_are_read_written_and_printed(tmp_path):
    """A Linux file name is bytes: one that is not UTF-8 opens, is written and is printed
    (escaped), in every command that takes a path; a missing one is still one line."""
    from nnhal.tflite import write_tflite

    d = os.fsencode(tmp_path)
    model = d + b"/m-\xff.tflite"
    Path(os.fsdecode(model)).write_bytes(write_tflite(add_model((2,))))
    for argv in (["info", model], ["view", model, "-o", d + b"/g-\xfe.html"],
                 ["view", model, "-o", d + b"/g-\xfe.svg"],
                 ["run", model, "--outputs", d + b"/o-\xfe.npz"],
                 ["bench", model, "--runs", "2", "--json", d + b"/b-\xfe.json"]):
        done = subprocess_nnhal(*argv)
        err = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 0, (argv, err)
        assert "Traceback" not in err
    for name in (b"g-\xfe.html", b"g-\xfe.svg", b"o-\xfe.npz", b"b-\xfe.json"):
        assert os.path.getsize(d + b"/" + name) > 0, name
    # printed escaped, as valid text
    assert b"m-\\xff.tflite" in subprocess_nnhal("info", model).stdout
    done = subprocess_nnhal("info", d + b"/gone-\xff.tflite")
    assert b"gone-\\xff.tflite" in done.stderr
    one_line(done.returncode, done.stderr.decode("utf-8", "replace"), 2, "no such file")


@pytest.mark.parametrize("argv", [["info", 3], ["info", "a\0b"]], ids=["int", "nul"])
def test_arguments_that_are_not_text_are_one_line(capsys, argv):
    status, _, err = nnhal(capsys, *argv) if not isinstance(argv[1], int) else \
        (cli.main(argv), *capsys.readouterr())
    one_line(status, err, 2, "argument 2")


# ---- numbers and devices ---------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["run", "add.tflite", "--seed", "-1"], "--seed"),
    (["run", "add.tflite", "--seed", str(2**70)], "--seed"),
    (["bench", "add.tflite", "--runs", str(10**9)], "--runs"),
    (["bench", "add.tflite", "--warmup", "-3"], "--warmup"),
    (["conformance", "--specs", "nowhere", "--loop-timeout-ms", "nan"], "--loop-timeout-ms"),
    (["conformance", "--specs", "nowhere", "--loop-timeout-ms", "-1"], "--loop-timeout-ms"),
    (["conformance", "--specs", "nowhere", "--jobs", "100000"], "--jobs"),
    (["mutations", "--specs", "nowhere", "--show-failures", "-1"], "--show-failures"),
    (["mutations", "--specs", "nowhere", "--every", "0"], "--every"),
    (["mutations", "--specs", "nowhere", "--limit", "-5"], "--limit"),
], ids=lambda v: "-".join(v) if isinstance(v, list) else v)
def test_numbers_out_of_range_are_usage_errors(capsys, argv, words):
    status, _, err = nnhal(capsys, *argv)
    one_line(status, err, 2, words)


@pytest.mark.parametrize("name, words", [
    ("gpu", "unknown device 'gpu'"),
    ("remote:/nowhere/at/all.sock", "no service answers"),
    ("remote:nosuchservice", "nosuchservice"),
])
@pytest.mark.parametrize("command", ["run", "bench", "info", "view"])
def test_an_unusable_device_is_a_usage_error(capsys, command, name, words):
    extra = ["-o", "g.html"] if command == "view" else []
    status, out, err = nnhal(capsys, command, "add.tflite", "--device", name, *extra)
    one_line(status, err, 2, words)
    assert out == ""


def test_an_unexpected_exception_is_one_line(monkeypatch, capsys):
    from nnhal.tools import info

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(info, "main", broken)
    status = cli.main(["info", "add.tflite"])
    _, err = capsys.readouterr()
    assert status == 1 and err.count("\n") == 1 and "internal error (ZeroDivisionError: a bug)" \
        in err and "Traceback" not in err
    monkeypatch.setenv("NNHAL_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["info", "add.tflite"])


# ---- fuzz ------------------------------------------------------------------------------------

FUZZ_INPUTS = 3000


def hostile_files(d: Path) -> dict[str, list[object]]:
    """Paths of every kind, by role."""
    os.mkfifo(d / "fifo")
    (d / "junk.tflite").write_bytes(os.urandom(64))
    (d / "empty").write_bytes(b"")
    (d / "specs").mkdir()
    npzs = [npz(d / f"in{k}.npz", m, compress=c) for k, (m, c) in enumerate([
        ({"a.npy": B, "b.npy": B}, False),
        ({"arr_0.npy": B, "arr_1.npy": B}, True),
        ({"a.npy": npy((1 << 40,)), "b.npy": B}, False),
        ({"a.npy": npy((2,), data=bytes(8 << 20)), "b.npy": B}, True),
        ({"a.npy": npy((2,), descr="|O"), "b.npy": B}, False),
        ({"a.npy": npy((2,), descr="<i4", data=bytes(8)), "b.npy": B}, False),
        ({"a.npy": B[:20], "b.npy": B}, False),
        ({"a.npy": npy((2, 3), data=bytes(24)), "b.npy": npy((2, 3), data=bytes(24))}, True),
        ({}, False),
    ])]
    cut = d / "cut.npz"
    cut.write_bytes(npzs[0].read_bytes()[:50])
    strange = [str(d / "fifo"), str(d), str(d / "missing"), str(d / "empty"),
               os.fsencode(d) + b"/\xff\xfe", "", "a\0b", str(d / "junk.tflite") + "/x"]
    return {
        "model": ["add.tflite", "dynamic.tflite", str(d / "junk.tflite"), *strange],
        "inputs": [*map(str, npzs), str(cut), *strange],
        "output": [str(d / "o.npz"), str(d / "g.html"), str(d / "g.svg"), str(d / "g.gif"),
                   str(d / "g.png"), str(d / "no" / "x.npz"), *strange],
        "specs": [str(d / "specs"), str(d / "missing"), str(d / "fifo")],
    }


NUMBERS = ["0", "1", "2", "-1", "3.5", "nan", "inf", "-inf", "1e999", str(2**64), "9" * 5000,
           "", "x", "0x10", " 7", "1_000"]
DEVICES = ["reference", "gpu", "", "remote:", "remote:/nowhere.sock", "remote:name", "litert",
           "remote:a\0b"]


def random_argv(rng: random.Random, paths: dict[str, list[object]]) -> list[object]:
    command = rng.choice(["run", "run", "run", "bench", "info", "view", "ops", "conformance",
                          "mutations", "nope", "--help", "run --help"])
    if command.endswith("--help") or command == "nope":
        return command.split()
    argv: list[object] = [command]
    pick = rng.choice
    if command in ("run", "bench", "info", "view"):
        if rng.random() < 0.95:
            argv.append(pick(paths["model"]))
        options = {"run": ["--inputs", "--outputs", "--device", "--seed"],
                   "bench": ["--device", "--runs", "--warmup", "--json"],
                   "info": ["--json", "--plan", "--device", "--preference"],
                   "view": ["-o", "--plan", "--device"]}[command]
        if command == "view" and rng.random() < 0.9:
            argv += ["-o", pick(paths["output"])]
        for _ in range(rng.randint(0, 4)):
            opt = pick(options + ["--frobnicate"])
            argv.append(opt)
            if opt in ("--json", "--plan") and command == "info":
                continue
            if opt == "--plan":
                continue
            value = {"--inputs": paths["inputs"], "--outputs": paths["output"],
                     "-o": paths["output"], "--json": paths["output"], "--device": DEVICES,
                     "--preference": ["fast", "slow", "low-power"]}.get(opt, NUMBERS)
            if opt in ("--runs", "--warmup"):
                value = [v for v in NUMBERS if v not in ("1e999",)] + ["1", "2", "3"] * 3
            if rng.random() < 0.97:
                argv.append(pick(value))
    elif command == "ops":
        argv += rng.sample(["CONV_2D", "ADD", "NOPE", "--markdown", "--extensions", "\udcff"],
                           rng.randint(0, 2))
    else:  # never runs cases: the specs folder is empty or unusable
        argv += ["--specs", pick(paths["specs"])]
        opts = ["--jobs", "--loop-timeout-ms", "--filter", "--device", "--json", "--mode"] \
            if command == "conformance" else ["--limit", "--every", "--seed", "--show-failures",
                                              "--shard", "--device", "--what"]
        for _ in range(rng.randint(0, 3)):
            opt = pick(opts)
            value = {"--device": DEVICES, "--json": paths["output"],
                     "--mode": ["general", "nope"], "--what": ["model", "x"],
                     "--shard": ["0/1", "1/0", "a/b"], "--filter": ["*", "x"]}.get(opt, NUMBERS)
            argv += [opt, pick(value)]
    return argv


def _main_into(argv: list[object], box: dict) -> None:
    try:
        box["status"] = cli.main(argv)
    except BaseException as e:  # noqa: BLE001 - the test reports it
        box["error"] = e


def test_fuzz_random_command_lines(tmp_path, capsys):
    """Random argument vectors against every command, in process: exit status 0, 1 or 2,
    never a traceback or an internal error, one line on stderr when the status is not 0,
    each command within BOUND seconds."""
    paths = hostile_files(tmp_path)
    rng = random.Random(20240601)
    started = time.monotonic()
    statuses = {0: 0, 1: 0, 2: 0}
    for k in range(FUZZ_INPUTS):
        argv = random_argv(rng, paths)
        box: dict = {}
        t = threading.Thread(target=_main_into, args=(list(argv), box), daemon=True)
        t.start()
        t.join(BOUND)
        out, err = capsys.readouterr()
        assert not t.is_alive(), f"input {k} hung: {argv!r}"
        assert "error" not in box, f"input {k} {argv!r} raised {box['error']!r}"
        status = box["status"]
        assert status in statuses, (k, argv, status, err)
        assert "Traceback" not in err and "internal error" not in err, (k, argv, err)
        if status:
            assert err.count("\n") == 1, (k, argv, err)
        statuses[status] += 1
    elapsed = time.monotonic() - started
    print(f"fuzz: {FUZZ_INPUTS} command lines in {elapsed:.1f} s; exit statuses {statuses}")
    assert statuses[0] > 0 and statuses[2] > 0
