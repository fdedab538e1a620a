"""``libneuralnetworks.so``: the NNAPI NDK's C library (feature level 5) over nnhal's runtime.

Design: CPython's C API, not cffi's embedding mode. Neither adds a dependency to the build
but cffi would add one at run time, and the two ways the library is loaded need control
cffi's embedding does not give. Loaded by a C program, it dlopens the libpython it was built
against and starts Python with the program name set to the python of the environment it was
installed into, found from its own path (dladdr: ``PREFIX/lib/pythonX.Y/site-packages/nnhal/
capi/lib`` → ``PREFIX/bin/python3``; a venv's ``pyvenv.cfg`` next to it makes Python that
venv), so it needs no PYTHONPATH and no activated environment; pip may build it in an
isolated environment because nothing about the install location is compiled in. Loaded
inside a Python process (``ctypes.CDLL``; PyTorch calls it with the GIL released), it finds
the running interpreter with ``dlsym(RTLD_DEFAULT, "Py_IsInitialized")`` and attaches to it.
libpython is never linked (no DT_NEEDED), so a static python process never gets a second
interpreter; a library built against a static Python says so on stderr and returns
OP_FAILED when a C program loads it. Every call holds the GIL (PyGILState_Ensure), so any
thread may call. The SONAME is ``libneuralnetworks.so`` and a version script exports the
NDK's names only.

Safe at any point of the host's life: a C-level gate (atomics, no Python) precedes every call.
A host whose own Python is not running (not started yet, or finalized) gets BAD_STATE and no
second interpreter; the library marks itself closing from its Python ``atexit`` callable
(registered at load by ctypes, or at the first call) and from a C ``atexit`` handler, waits up
to 10 s with the GIL released for the calls already inside, and from then on answers
BAD_STATE (frees: nothing) without touching Python, so ``PyGILState_Ensure`` is never called on
a finalizing interpreter. It never finalizes an interpreter, its own included. The bridge
checks that client memory it reads is mapped (process_vm_readv) and bounds every count.

Thin C: each exported function (``wrappers.inc``, generated from :data:`header.FUNCTIONS`)
passes its arguments as ints to the same-named function of :mod:`nnhal.capi.bridge`, which
reads the client's structs and arrays within the counts and lengths given, keeps the handle
table (freed, foreign or mistyped handles are BAD_DATA, never a crash) and calls
:mod:`nnhal.runtime.ndk`, where the rules are. Outputs are written into the client's buffer
by the execution at compute/wait time, within the length given.

Not here: ``ANeuralNetworksMemory_createFromAHardwareBuffer`` and the extension functions
(no AHardwareBuffer or vendor extensions on Linux), the five functions feature level 5 added
for memory alignment and padding (``Compilation_getPreferredMemoryAlignment/PaddingFor
Input/Output``, ``Execution_enableInputAndOutputPadding``: nnhal.runtime.ndk lacks them),
and the support-library entry point ``ANeuralNetworks_getSLDriverImpl``, which returns a
``NnApiSLDriverImplFL5``: a feature-level header followed by function pointers in the order
of upstream's NeuralNetworksSupportLibraryImpl.h, which includes those missing functions and
the ``SL_ANeuralNetworks*`` ones (caching from fds, per-device performance information, vendor
extensions, diagnostic callbacks). With them in ndk.py it is a static table of our wrappers
plus small stubs.
"""
