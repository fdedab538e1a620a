"""A Session's bound feed layout: the repeated-run path (see :mod:`nnhal.session.session`).

After a good run, its feed layout is bound: feeds of the very dtypes and shapes that run had
are taken as checked, the request memory is reused, and a driver's own binding runs them; a
streaming model's binding may keep its state itself, and then the Session's ``run`` becomes
a closure for the common case (:func:`stateful_fast`), as it does for a model without state
once its binding answered well (:func:`plain_fast`).
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nnhal.core.native import BUILDS, NativeModule, building
from nnhal.hal.request_layout import RequestLayout

#: The Session bound (``nnhal.session.session.Session``, not imported: that module imports
#: this one) and its feeds (``nnhal.session.session.Feeds``).
Session = Any
Feeds = Any

#: The fast ways as one native call (``fastrun.c``): built at first use, on a thread of its
#: own; until then, and where it cannot be, the closures below do the same in Python (and
#: give way to it once a build ends, :func:`_giving_way`).
FASTRUN = NativeModule("nnhal_session_fastrun", Path(__file__).with_name("fastrun.c"))


def session_lock() -> Any:
    """A new Session's lock: the native module's ``Lock`` where that module is built already
    (its run then takes the lock without a Python call, and the lock knows its holder), else
    a ``threading.Lock``. Never a compiler run: a Session's open stays quick, and the module
    is built at a later run. Chosen once per Session, since a lock cannot be swapped under
    threads that may wait on it."""
    m = FASTRUN.module(build=False)
    return m.Lock() if m is not None else threading.Lock()


def _giving_way(session: Session, bound: Bound) -> Callable[[], None]:
    """What a Python twin calls once a native build has ended since it was installed
    (:data:`~nnhal.core.native.BUILDS`): it uninstalls itself (under the lock, when free), so
    the Session's next bound run installs its fast run again, the native one where that
    build now loads (the calls into the driver too)."""
    acquire, release, state = session._lock.acquire, session._lock.release, session.__dict__

    def give_way() -> None:
        if acquire(False):
            try:
                if state.get("_bound") is bound:
                    state.pop("run", None)
                    bound.fast = False
            finally:
                release()
    return give_way


def _native_fast(session: Session, bound: Bound, call: Any, *, guard: tuple[str, Any],
                 holder: Any, note_owner: bool, on_none: Callable[[], object],
                 out_names: Sequence[str]) -> Any | None:
    """The native ``run`` for ``bound`` (None: not built here, or a native build is under
    way: the twin, which takes the native parts up when it ends, runs meanwhile)."""
    m = FASTRUN.soon()
    if m is None or building():
        return None
    try:
        return m.FastRun(
            names=tuple(i.name for i in session.inputs),
            dtypes=tuple(d for d, _ in bound.signature),
            shapes=tuple(tuple(int(x) for x in s) for _, s in bound.signature),
            converting=session._converting, lock=session._lock, state=session.__dict__,
            guard_key=guard[0], guard_value=guard[1], holder=holder, runner=bound.runner,
            call=call, on_none=on_none, out_names=tuple(out_names), usual=type(session).run,
            me=weakref.ref(session), note_owner=note_owner)
    except (TypeError, ValueError, OverflowError, MemoryError):
        return None  # (a layout it cannot hold, a dtype numpy does not know: the closure)


class Bound:
    """The feed layout of a Session's last good run, bound for runs of it again: feeds that
    are plain numpy arrays of the very dtypes and shapes that run had are taken as checked (the
    full check passed on them), the request memory and views of its outputs are reused, and a
    driver's own binding (``bind_arrays``) runs them without request memory. Anything else
    (another shape, a list, a conversion) takes the general way, which checks it, and binds
    its layout in turn."""

    __slots__ = ("prepared", "count", "getter", "signature", "layout", "dims", "out_dtypes",
                 "out_views", "runner", "checked", "stateful", "names", "answers", "fast", "shapes",
                 "pairs", "pending")

    def __init__(self) -> None:
        self.prepared: Any = None
        #: The public inputs: how many, a dict's values of them in order, and per input the
        #: (dtype, shape) of its feed.
        self.count = 0
        self.getter: Any = None
        self.signature: list[tuple[np.dtype, tuple[int, ...]]] = []
        #: The request memory of the bound run (None: bound from a run the driver's binding
        #: did, :meth:`of_arrays`).
        self.layout: RequestLayout | None = None
        #: Per output: its dimensions in the bound run, and its dtype.
        self.dims: list[list[int]] = []
        self.out_dtypes: list[np.dtype] = []
        #: Per output: a typed view of its place in the request memory (None: a bool output,
        #: read by the general way).
        self.out_views: list[np.ndarray] | None = None
        self.runner: Any = None
        #: Whether the driver's binding answered outputs of the bound run's shapes once.
        self.checked = False
        #: Whether ``runner`` keeps the state itself (``bind_arrays_with_state``): it takes
        #: the public inputs and gives the public outputs, named by ``names``.
        self.stateful = False
        self.names: list[str] = []
        #: Per output the driver's binding gives (all, or the public ones when stateful):
        #: its dimensions and dtype in the bound run.
        self.answers: list[tuple[list[int], np.dtype]] = []
        #: Whether the Session's ``run`` is this binding's direct way (:func:`stateful_fast`,
        #: :func:`plain_fast`), made once the binding answered well.
        self.fast = False
        #: Per main input, its shape in the bound run; the state pairs (main input, main
        #: output); whether the stateful binding is still to be made (at the next run).
        self.shapes: list[tuple[int, ...]] = []
        self.pairs: list[tuple[int, int]] = []
        self.pending = False

    @classmethod
    def of(cls, session: Session, layout: RequestLayout, arrays: Sequence[np.ndarray],
           outs: Sequence[np.ndarray]) -> Bound | None:
        """The layout of a run by request that gave ``outs``; None when a state variable's
        value would leave it (its output of another shape or dtype than its input's)."""
        for j, sv in enumerate(session._state_vars):
            given, got, initial = arrays[sv.input], outs[sv.output], session._initial[j]
            if got.shape != given.shape or got.dtype != given.dtype or \
                    initial.shape != given.shape:
                return None
        b = cls._of_run(session, arrays, outs)
        b.layout = layout
        if not any(o.dtype == np.bool_ for o in outs):
            b.out_views = [layout.output_view(k, o.nbytes).view(o.dtype).reshape(o.shape)
                           for k, o in enumerate(outs)]
        b.shapes = [tuple(a.shape) for a in arrays]
        if session._state_vars and \
                getattr(b.prepared, "bind_arrays_with_state", None) is not None:
            # Bound at the first run of this layout again, not now: a stream's first result
            # waits for no flatbuffer or interpreter it may never use again.
            b.stateful = b.pending = True
            b.names = [name for name, _ in session._out_names]
            b.answers = [(b.dims[k], b.out_dtypes[k]) for k in session._public_out]
            b.pairs = [(sv.input, sv.output) for sv in session._state_vars]
            return b
        b.bind_plain()
        return b

    @classmethod
    def _of_run(cls, session: Session, arrays: Sequence[np.ndarray],
                outs: Sequence[np.ndarray]) -> Bound:
        """What every bound layout holds of the run it was bound from: the prepared model,
        the feeds' order, dtypes and shapes, the outputs' dimensions and dtypes."""
        b = cls()
        b.prepared = session._prepared
        names = [i.name for i in session.inputs]
        b.count = len(names)
        b.getter = operator.itemgetter(*names) if names else lambda feeds: ()
        b.signature = [(i.dtype, tuple(arrays[k].shape))
                       for i, k in zip(session.inputs, session._public_in)]
        b.dims = [list(o.shape) for o in outs]
        b.out_dtypes = [o.dtype for o in outs]
        return b

    @classmethod
    def of_arrays(cls, session: Session, arrays: Sequence[np.ndarray],
                  outs: Sequence[np.ndarray], runner: Any) -> Bound:
        """The layout of a first run that ``runner`` (the driver's ``bind_arrays``) ran and
        that gave ``outs``, of the outputs' declared shapes and dtypes (checked), for a model
        without state: bound with no request memory (``layout`` None), which a run the
        binding cannot do makes by the general way, binding that layout in turn."""
        b = cls._of_run(session, arrays, outs)
        b.shapes = [tuple(a.shape) for a in arrays]
        b.answers = list(zip(b.dims, b.out_dtypes))
        b.runner = runner  # (its answers checked again at the next run, as any binding's)
        return b

    def bind_plain(self) -> None:
        """The driver's binding of arrays with the state carried (or none: by request)."""
        self.stateful = False
        self.answers = list(zip(self.dims, self.out_dtypes))
        bind = getattr(self.prepared, "bind_arrays", None)
        self.runner = None
        if bind is not None:
            try:
                self.runner = bind(self.shapes)
            except Exception:  # noqa: BLE001 - a driver that cannot bind: runs go by request
                self.runner = None

    def bind_state(self) -> None:
        """The driver's stateful binding, made at the first run that uses it; where the
        driver does not make one, its binding with the state carried."""
        self.pending = False
        try:
            self.runner = self.prepared.bind_arrays_with_state(self.shapes, self.pairs)
        except Exception:  # noqa: BLE001 - a driver that cannot: the state is carried
            self.runner = None
        if self.runner is None:
            self.bind_plain()

    def match(self, feeds: Any) -> list[np.ndarray] | None:
        """The feeds as arrays in input order when they are a dict by name or a list of
        plain arrays of the bound dtypes and shapes, else None. Runs none of the caller's code
        (a dict and a list exactly, ndarrays exactly)."""
        kind = type(feeds)
        if kind is dict:
            if len(feeds) != self.count:
                return None
            try:
                got = self.getter(feeds)
            except KeyError:
                return None
            arrays = [got] if self.count == 1 else list(got)
        elif kind is list or kind is tuple:
            if len(feeds) != self.count:
                return None
            arrays = list(feeds)
        else:
            return None
        signature = self.signature
        k = 0
        ndarray = np.ndarray
        for a in arrays:
            # (dtype, shape) compared as a tuple: the very dtype object by identity, else ==.
            if type(a) is not ndarray or (a.dtype, a.shape) != signature[k]:
                return None
            k += 1
        return arrays

    def same_outputs(self, outs: Sequence[np.ndarray]) -> bool:
        """Whether a driver binding's outputs are of the bound run's shapes and dtypes (asked
        once: the binding promises the model's declared shapes)."""
        self.checked = len(outs) == len(self.answers) and all(
            type(o) is np.ndarray and list(o.shape) == d and o.dtype == t
            for o, (d, t) in zip(outs, self.answers))
        return self.checked


def plain_fast(session: Session, bound: Bound) -> Any:
    """``session.run`` for runs of ``bound``'s driver binding straight from the feeds, for a
    model without state, in the common case: a dict of plain arrays of the bound dtypes and
    shapes, ``bound`` still the Session's bound layout with its binding, the Session's lock
    free. Anything else goes to :meth:`Session.run`, as :func:`stateful_fast` does (a layout
    bound anew, a failed binding, ``close``: each replaces the Session's bound layout or its
    binding first), so that a call costs about what ai-edge-litert's own ``set_tensor`` +
    ``invoke`` + ``get_tensor`` do. Installed, and holding the Session, as
    :func:`stateful_fast` is."""
    runner = bound.runner
    call = runner.direct()
    names = [name for name, _ in session._out_names]

    def lost() -> None:
        bound.runner = None  # by request from now on, which reports

    native = _native_fast(session, bound, call, guard=("_bound", bound), holder=bound,
                          note_owner=True, on_none=lost, out_names=names)
    if native is not None:
        return native
    acquire, release = session._lock.acquire, session._lock.release
    state = session.__dict__
    converting = session._converting
    me = weakref.ref(session)
    usual = type(session).run
    one = len(names) == 1
    match = bound.match
    ident = threading.get_ident

    builds, seen, give_way = BUILDS, BUILDS[0], _giving_way(session, bound)

    def fast(feeds: Feeds) -> dict[str, np.ndarray]:
        if builds[0] != seen:
            give_way()
        if type(feeds) is dict and not converting:
            arrays = match(feeds)
            if arrays is not None and acquire(False):
                try:
                    if state["_bound"] is bound and bound.runner is runner:
                        # The owner noted: a driver's binding may run an extension's Python
                        # code, which must not wait for this lock (Session.run reports it).
                        state["_owner"] = ident()
                        outs = call(arrays)
                        if outs is not None:
                            return {names[0]: outs[0]} if one else dict(zip(names, outs))
                        bound.runner = None  # by request from now on, which reports
                finally:
                    state["_owner"] = None
                    release()
        return usual(me(), feeds)  # type: ignore[arg-type]
    fast.__doc__ = usual.__doc__
    return fast


def stateful_fast(session: Session, bound: Bound) -> Any:
    """``session.run`` for runs of ``bound``'s stateful binding straight from the feeds, in
    the common case: a dict of plain arrays of the bound dtypes and shapes, the binding
    holding the state, the Session's lock free. Anything else goes to :meth:`Session.run`
    (which checks, waits for the lock or reports), as does everything once the binding no
    longer holds the state (a run by request, a reset, another layout, ``close``: each takes
    the state back first, so a binding holding it is the Session's bound one). Every check of
    the usual way is kept, in fewer steps, so that a stream's call costs about what
    ai-edge-litert's own ``set_tensor`` + ``invoke`` + ``get_tensor`` do. The lock's owner is
    noted only when something is to be reported (a failed run): the binding's run calls no
    Python code that could call the Session again.

    Installed as the instance's ``run`` (it shadows the method). It holds the instance's
    ``__dict__`` and a weak reference to the Session, never the Session itself, so a dropped
    Session is still closed at once by its ``__del__``."""
    runner = bound.runner
    run = runner.run
    acquire, release = session._lock.acquire, session._lock.release
    state = session.__dict__
    converting = session._converting
    me = weakref.ref(session)
    usual = type(session).run
    ndarray = np.ndarray
    names = list(bound.names)

    def failed() -> None:
        """The run failed: the state before it back from the binding (under the lock, its
        owner noted), and the usual way runs the feeds by request."""
        state["_owner"] = threading.get_ident()
        try:
            me()._stateful_failed(bound)  # type: ignore[union-attr]
        finally:
            state["_owner"] = None

    native = _native_fast(session, bound, runner.direct(), guard=("_state_holder", runner),
                          holder=None, note_owner=False, on_none=failed, out_names=names)
    if native is not None:
        return native
    builds, seen, give_way = BUILDS, BUILDS[0], _giving_way(session, bound)
    if bound.count == 1 and len(names) == 1:
        key, out_name = session.inputs[0].name, names[0]
        dtype, shape = bound.signature[0]
        run_one = runner.one_call()

        def fast(feeds: Feeds) -> dict[str, np.ndarray]:
            if builds[0] != seen:
                give_way()
            if type(feeds) is dict and len(feeds) == 1 and not converting:
                try:
                    a = feeds[key]
                except KeyError:
                    a = None
                if type(a) is ndarray and a.shape == shape and \
                        (a.dtype is dtype or a.dtype == dtype) and acquire(False):
                    try:
                        if state["_state_holder"] is runner:
                            out = run_one(a)
                            if out is not None:
                                return {out_name: out}
                            failed()
                    finally:
                        release()
            return usual(me(), feeds)  # type: ignore[arg-type]
    else:
        def fast(feeds: Feeds) -> dict[str, np.ndarray]:
            if builds[0] != seen:
                give_way()
            if type(feeds) is dict and not converting:
                arrays = bound.match(feeds)
                if arrays is not None and acquire(False):
                    try:
                        if state["_state_holder"] is runner:
                            outs = run(arrays)
                            if outs is not None:
                                return dict(zip(names, outs))
                            failed()
                    finally:
                        release()
            return usual(me(), feeds)  # type: ignore[arg-type]
    fast.__doc__ = usual.__doc__
    return fast
