"""Opening a Session through the Session cache (:mod:`nnhal.session.cache`): whether the
cache applies (:func:`cache_source`), the entry's key and lookup (:func:`open_cached`), the
restore of an entry and, after a miss, writing it (:class:`Opened`). Apart from
:mod:`nnhal.session.session`, which holds what a Session is and how it runs; the Session
calls in here while it opens."""

from __future__ import annotations

import os
from typing import Any

from nnhal.hal.interfaces import IDevice, IPreparedModel, PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, Model, Priority
from nnhal.session import pending

#: The Session being opened (``nnhal.session.session.Session``, not imported: that module
#: imports this one).
Session = Any

#: Seconds to wait for a driver to report a preparation before calling it hung.
PREPARE_TIMEOUT = 600.0


def cache_source(source: Any, cache: bool | None
                 ) -> tuple[Any, bytes, bytes | None, Any] | None:
    """(the Session cache's store, the content's digest, the bytes when they were read, the
    code fingerprint being verified) for a .tflite path or bytes when the cache is to be used
    for it (:mod:`nnhal.session.cache`), else None."""
    from nnhal.session import cache as sc

    if not sc.enabled(cache):
        return None
    try:
        size = len(source) if isinstance(source, (bytes, bytearray)) else \
            os.stat(source).st_size
    except (OSError, TypeError, ValueError):
        return None  # load_model names the problem
    if cache is None and size < sc.MIN_BYTES:
        return None
    store = sc.Store.default()
    if store is None:
        return None
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
        return store, sc.content_digest(data), data, sc.Fingerprint(store.directory)
    try:
        code = sc.Fingerprint(store.directory)  # the guess; checked once it finds an entry
        # Content not seen before (likely a miss): hashed when its entry is written.
        digest, data = store.file_digest(os.fspath(source), background=True)
    except (OSError, ValueError):
        return None
    return store, digest, data, code


def open_cached(session: Session, store: Any, code: Any, chosen: list[Any] | None,
                preference: ExecutionPreference, priority: Priority,
                digest: bytes | Any) -> Opened:
    """Restore from the Session cache when it holds this file (then ``restored``);
    else what the miss needs to write the entry. The entry tried first is keyed with the
    code fingerprint's guess (``code``, :class:`nnhal.session.cache.Fingerprint`); when
    the verified one differs, the guess's restore is dropped and the right key tried.
    ``digest``: the content's, or a :class:`~nnhal.session.cache.Digesting` for content not
    seen before under this name: then nothing is looked up (a miss), and the entry's key is
    made when it is written."""
    from nnhal.session import cache as sc

    if session.device is not None:
        status, version = session.device.get_version_string()
        config: list[Any] = ["device", session.device_name,
                             str(version) if status == ErrorStatus.NONE else ""]
        candidates: list[Any] = []
    else:
        from nnhal.runtime.devices import devices as available

        candidates = list(chosen) if chosen is not None else available()
        config = ["runtime", chosen is not None, [[d.name, d.version] for d in candidates]]
    config += [int(preference), int(priority), [list(n) if n is not None else None
                                                for n in session._names]]
    opened = Opened(store, config, digest, candidates, chosen is not None,
                    preference, priority, code)
    if opened.key is None:
        return opened
    for _ in range(2):
        key = opened.key
        pending.wait(key)  # an entry this process is writing is read once written
        record = store.load(key)
        if record is not None:
            code.begin()  # checked while the drivers restore
            try:
                opened.restore(session, record)
            except Exception as e:  # noqa: BLE001 - a record of the wrong shape: a miss
                sc.log.info("session cache entry not restored: %s: %s",
                            type(e).__name__, e)
                session.restored = False
        if session.restored:
            break
        opened.settle()  # the key is the verified one from here: a miss writes it
        if opened.key == key:
            break
    return opened


def prepare_quietly(hal: IDevice, model: Model) -> IPreparedModel | None:
    """``model`` prepared on ``hal`` without caching, or None."""
    cb = PreparedModelCallback()
    try:
        launched = hal.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                     Priority.MEDIUM, None, [], [], b"", cb)
        if launched != ErrorStatus.NONE:
            return None
        status, pm = cb.wait(PREPARE_TIMEOUT)
    except Exception:  # noqa: BLE001 - a driver that raises prepared nothing
        return None
    return pm if status == ErrorStatus.NONE else None


def _complete(found: Any) -> bool:
    """Every file of a driver's cache (``cache_names``) is there, the model caches not empty."""
    if found is None:
        return False
    _token, names, n_model = found
    try:
        return all(os.path.getsize(n) > 0 for n in names[:n_model]) and \
            all(os.path.exists(n) for n in names[n_model:])
    except OSError:
        return False


def _restore(hal: IDevice, found: Any) -> IPreparedModel | None:
    """prepareModelFromCache on ``found``'s files (``cache_names``), or None."""
    if not _complete(found):
        return None
    token, names, n_model = found
    fds: list[int] = []
    try:
        for n in names:
            fds.append(os.open(n, os.O_RDONLY | os.O_CLOEXEC))
        cb = PreparedModelCallback()
        if hal.prepare_model_from_cache(None, fds[:n_model], fds[n_model:], token,
                                        cb) != ErrorStatus.NONE:
            return None
        status, pm = cb.wait(PREPARE_TIMEOUT)
        return pm if status == ErrorStatus.NONE else None
    except Exception:  # noqa: BLE001 - anything: a miss
        return None
    finally:
        for fd in fds:
            os.close(fd)


class Opened:
    """One Session's use of the Session cache: the entry's key, and how to restore the
    entry or write it after a miss."""

    def __init__(self, store: Any, config: list[Any], digest: bytes | Any,
                 candidates: list[Any], explicit: bool, preference: ExecutionPreference,
                 priority: Priority, code: Any):
        self.store = store
        self.config = config
        self._code = code
        #: The code fingerprint the key is made with: the guess until :meth:`settle`.
        self.fingerprint: str = code.guess
        self._settled = False
        #: The token the drivers' cache files are named by (None: the entry's key), and the
        #: digest still to be computed (the entry's key is None until then).
        self._files: bytes | None = None
        self._digesting: Any = None
        self.digest = b""
        self.key: bytes | None = None
        if isinstance(digest, bytes):
            self.rekey(digest)
        else:
            self._digesting = digest
            self._files = os.urandom(32)
        self.candidates = candidates
        self.explicit = explicit
        self.preference = preference
        self.priority = priority

    def rekey(self, digest: bytes) -> None:
        """Key the entry by ``digest`` (the content actually read)."""
        from nnhal.session import cache as sc

        self.digest = digest
        self.key = sc.entry_key(digest, self.config, self.fingerprint)

    def files(self) -> bytes:
        """The token this entry's driver cache files are named by (and that their drivers
        check): the entry's key, or for an entry keyed only when written (content not seen
        before), a random one; the entry records it, so a restore finds them either way."""
        return self._files if self._files is not None else self.key  # type: ignore[return-value]

    def _resolve(self) -> None:
        """The entry's key, once the content's digest is computed (OSError: the file
        changed while it was read)."""
        if self._digesting is not None:
            digest = self._digesting.result()
            self._digesting = None
            self.settle()
            self.rekey(digest)

    def settle(self) -> bool:
        """Verify the code fingerprint the key was made with; True when it was not this
        code's (the key is then remade with the right one, and anything restored with the
        other must be dropped)."""
        if self._settled:
            return False
        self._settled = True
        real = self._code.settle()
        if real == self.fingerprint:
            return False
        self.fingerprint = real
        self.rekey(self.digest)
        return True

    # ---- the device path: the driver's own cache files -----------------------------------
    def _device_names(self, session: Session) -> Any:
        from nnhal.runtime.compilation import cache_names
        from nnhal.runtime.devices import Device

        return cache_names(str(self.store.steps), self.files(),
                           Device.of(session.device, session.device_name))

    def device_files(self, session: Session) -> tuple[list[int], list[int], bytes] | None:
        """Open (created) cache files for preparing on the Session's device, or None."""
        found = self._device_names(session)
        if found is None:
            return None
        from nnhal.runtime.compilation import open_cache_files

        token, names, n_model = found
        opened = open_cache_files(names, n_model)
        return None if opened is None else (opened[0], opened[1], token)

    # ---- restoring --------------------------------------------------------------------------
    def restore(self, session: Session, record: dict[str, Any]) -> None:
        """Make ``session`` from ``record``; leaves it unrestored when a driver refuses its
        cache (raises for a record of the wrong shape). The drivers' files are those the
        record names; unrestored, a miss writes its own under the entry's key."""
        files = record.get("files_key")
        if files is not None and (not isinstance(files, str) or len(files) != 64):
            raise ValueError("files_key is not a 32-byte token")
        self._files = None if files is None else bytes.fromhex(files)
        try:
            self._restore_record(session, record)
        finally:
            if not session.restored:
                self._files = None

    def _restore_record(self, session: Session, record: dict[str, Any]) -> None:
        from nnhal.session import cache as sc

        ins = [sc.tensor_from(r) for r in record["inputs"]]
        outs = [sc.tensor_from(r) for r in record["outputs"]]
        state = [sc.state_from(r) for r in record["state"]]
        plan = [{"device": str(p["device"]),
                 "operations": [int(k) for k in p["operations"]],
                 "inputs": [int(k) for k in p["inputs"]],
                 "outputs": [int(k) for k in p["outputs"]]} for p in record["plan"]]
        if record["kind"] == "device" and session.device is not None:
            prepared = _restore(session.device, self._device_names(session))
        elif record["kind"] == "runtime" and session.device is None:
            prepared = self._restore_runtime(session, record)
        else:
            return
        if prepared is None or self.settle():
            return  # refused, or restored with another code's key: dropped
        session._set_io(ins, outs, state)
        scalars = record.get("scalars", {})
        session._set_scalars([int(k) for k in scalars.get("inputs", ())],
                             [int(k) for k in scalars.get("outputs", ())])
        session._prepared = prepared
        session._restored_plan = plan
        session.device_name = str(record["device_name"])
        session.restored = True

    def _split(self, step: str | None) -> bytes | None:
        from nnhal.runtime.compilation import partition_key

        if step is None:
            return None
        return partition_key(self.candidates, int(self.preference)) + b"\0" + step.encode()

    def _restore_runtime(self, session: Session, record: dict[str, Any]) -> Any:
        from types import SimpleNamespace

        from nnhal.hal.types import OperandLifeTime, Subgraph
        from nnhal.runtime.compilation import cache_names
        from nnhal.runtime.partition import Step
        from nnhal.runtime.plan import FallbackPrepared, PlanPrepared
        from nnhal.session import cache as sc

        by_name = {d.name: d for d in self.candidates}
        done = []
        for st in record["steps"]:
            device = by_name[str(st["device"])]
            step = st["step"]
            pm = _restore(device.hal, cache_names(str(self.store.steps), self.files(), device,
                                                  self._split(None if step is None
                                                              else str(step))))
            if pm is None:
                return None
            done.append((device, pm, st))
        fallback = None if self.explicit else session._reference_fallback
        ref = None if self.explicit else by_name.get("reference")
        if len(done) == 1 and done[0][2]["step"] is None:
            device, pm, _ = done[0]
            return pm if ref is None or ref is device else FallbackPrepared(pm, fallback)
        main = record["main"]
        ins_set = {int(i) for i in main["inputs"]}
        outs_set = {int(i) for i in main["outputs"]}
        operands = {}
        for k, rec in main["operands"].items():
            i = int(k)
            life = OperandLifeTime.SUBGRAPH_INPUT if i in ins_set else \
                OperandLifeTime.SUBGRAPH_OUTPUT if i in outs_set else \
                OperandLifeTime.TEMPORARY_VARIABLE
            operands[i] = sc.operand_from(rec, life)
        skeleton = Subgraph(operands, [], [int(i) for i in main["inputs"]],
                            [int(i) for i in main["outputs"]])  # type: ignore[arg-type]
        steps = []
        for device, pm, st in done:
            declared = [sc.operand_from(r, OperandLifeTime.SUBGRAPH_OUTPUT)
                        for r in st["declared"]]
            sub = SimpleNamespace(main=Subgraph(declared, [], [], list(range(len(declared)))))
            steps.append(Step(device, [int(k) for k in st["operations"]],
                              [int(k) for k in st["inputs"]], [int(k) for k in st["outputs"]],
                              sub, pm))  # type: ignore[arg-type]
        whole_name = record.get("whole_device")
        whole_device = by_name.get(str(whole_name)) if whole_name is not None else None
        kept: list[Any] = []

        def whole() -> IPreparedModel | None:
            if whole_device is None:
                return None
            if not kept:
                kept.append(prepare_quietly(whole_device.hal, session.model))
            return kept[0]

        return PlanPrepared(skeleton, steps, fallback, whole, model=None)

    # ---- writing ----------------------------------------------------------------------------
    def save(self, session: Session) -> None:
        """Write the entry of a Session just prepared (never raises)."""
        from nnhal.session import cache as sc

        try:
            self._resolve()
            record = self._record(session)
        except Exception as e:  # noqa: BLE001 - caching never fails a Session
            sc.log.info("session cache entry not written: %s: %s", type(e).__name__, e)
            return
        if record is not None and self.key is not None:
            self.store.save(self.key, record)

    def _record(self, session: Session) -> dict[str, Any] | None:
        from nnhal.hal.types import OperandLifeTime, OperandType
        from nnhal.runtime.compilation import cache_names, step_key
        from nnhal.session import cache as sc

        infos = [*session._all_inputs, *session._all_outputs]
        if not all(isinstance(i.type, OperandType) for i in infos):
            return None  # an extension's type: described by its extension, not cached
        record: dict[str, Any] = {
            "inputs": [sc.tensor_record(i) for i in session._all_inputs],
            "outputs": [sc.tensor_record(i) for i in session._all_outputs],
            "state": [sc.state_record(sv, v)
                      for sv, v in zip(session._state_vars, session._initial)],
            "plan": session.plan, "device_name": session.device_name,
            "scalars": {"inputs": list(session._scalar_io[0]),
                        "outputs": list(session._scalar_io[1])}}
        files: list[str] = []
        if session.device is not None:
            found = self._device_names(session)
            if not _complete(found):
                return None
            files += found[1]
            record["kind"] = "device"
        else:
            comp = session.compilation
            main = session.model.main
            constants = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)
            whole = comp.device is not None
            steps, used = [], {*main.input_indexes, *main.output_indexes}
            for st in comp.steps:
                if st.device is None or any(main.operands[i].lifetime in constants
                                            for i in st.inputs):
                    return None  # the runtime runs an IF/WHILE, or a step reads a constant
                step = None if whole else step_key("main", st.operations).decode()
                found = cache_names(str(self.store.steps), self.files(), st.device,
                                    self._split(step))
                if not _complete(found):
                    return None
                files += found[1]
                sub = st.model.main
                steps.append({"device": st.device.name, "step": step,
                              "operations": list(st.operations), "inputs": list(st.inputs),
                              "outputs": list(st.outputs),
                              "declared": [sc.operand_record(sub.operands[i])
                                           for i in sub.output_indexes]})
                used.update(st.inputs)
                used.update(st.outputs)
            whole_device = getattr(comp, "_whole_device", None)
            record.update(kind="runtime", steps=steps,
                          whole_device=None if whole_device is None else whole_device.name,
                          main={"inputs": list(main.input_indexes),
                                "outputs": list(main.output_indexes),
                                "operands": {str(i): sc.operand_record(main.operands[i])
                                             for i in sorted(used)}})
        record["files"] = [os.path.basename(f) for f in files]
        record["files_key"] = self.files().hex()
        return record
