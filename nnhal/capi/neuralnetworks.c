/* libneuralnetworks.so of nnhal: the NNAPI NDK's C functions over nnhal's Python runtime.
 *
 * Thin by design: every exported function (wrappers.inc, generated) passes its arguments as
 * Python ints to the function of the same name in nnhal.capi.bridge, which reads the client's
 * structs and arrays and calls nnhal.runtime.ndk, where the API's rules live. This file only
 * finds or starts an interpreter and holds the GIL around each call.
 *
 * CPython's C API, not cffi's embedding mode: no build or run-time dependency, and the two
 * ways of being loaded need explicit control cffi does not give: inside a Python process
 * (ctypes.CDLL, e.g. PyTorch's tests) the library must attach to the running interpreter,
 * which it finds with dlsym(RTLD_DEFAULT); loaded by a C program it dlopens libpython itself
 * and starts it, with the program name set to the python of the environment the library was
 * installed into (found from the library's own path with dladdr: .../site-packages/nnhal/...
 * -> prefix/bin/python, whose pyvenv.cfg, if any, makes it that venv). Python is never
 * linked (no DT_NEEDED on libpython), so a static python process cannot get a second copy;
 * every Python function is called through a pointer looked up at first use.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "NeuralNetworks.h"

#define NN_EXPORT __attribute__((visibility("default")))

/* Set by the build: the shared libpython of the interpreter built against ("" when that
 * Python is static), and for builds into a private cache the python and the sys.path entry
 * of the source tree (empty for an installed library, which finds them at run time). */
#ifndef NNHAL_LIBPYTHON
#define NNHAL_LIBPYTHON ""
#endif
#ifndef NNHAL_EXECUTABLE
#define NNHAL_EXECUTABLE ""
#endif
#ifndef NNHAL_SYSPATH
#define NNHAL_SYSPATH ""
#endif

static const char BRIDGE[] = "nnhal.capi.bridge";

/* How long closing waits for the calls already inside Python to return before it lets the
 * interpreter (or the process) go on ending; a call still inside after that is abandoned. */
#define DRAIN_NS 10000000000LL

static struct {
    int (*IsInitialized)(void);
    int (*IsFinalizing)(void);                 /* optional: Py_IsFinalizing / _Py_IsFinalizing */
    PyThreadState *(*UncheckedGet)(void);      /* optional: the attached thread state */
    PyThreadState *(*GILState_GetThisThreadState)(void);
    PyGILState_STATE (*GILState_Ensure)(void);
    void (*GILState_Release)(PyGILState_STATE);
    PyThreadState *(*Eval_SaveThread)(void);
    void (*Eval_RestoreThread)(PyThreadState *);
    void (*Config_InitPythonConfig)(PyConfig *);
    PyStatus (*Config_SetBytesString)(PyConfig *, wchar_t **, const char *);
    void (*Config_Clear)(PyConfig *);
    PyStatus (*InitializeFromConfig)(const PyConfig *);
    int (*Status_Exception)(PyStatus);
    PyObject *(*Import_ImportModule)(const char *);
    PyObject *(*Object_GetAttrString)(PyObject *, const char *);
    PyObject *(*Object_CallObject)(PyObject *, PyObject *);
    PyObject *(*VaBuildValue)(const char *, va_list);
    long long (*Long_AsLongLong)(PyObject *);
    PyObject *(*Err_Occurred)(void);
    void (*Err_Print)(void);
    void (*DecRef)(PyObject *);
    PyObject *(*Sys_GetObject)(const char *);
    int (*List_Insert)(PyObject *, Py_ssize_t, PyObject *);
    PyObject *(*Unicode_DecodeFSDefault)(const char *);
    PyObject *(*CFunction_NewEx)(PyMethodDef *, PyObject *, PyObject *);
} py;

/* The library's life, in three flags read with atomics before anything touches Python:
 *   state    UNTRIED until an interpreter is found or started (READY) or known impossible
 *            (UNAVAILABLE); a host whose Python is not running yet leaves it UNTRIED, so a
 *            later call tries again;
 *   closing  set once, for good, when the interpreter or the process starts ending (our
 *            Python atexit callable, our C atexit handler): no call enters Python after it;
 *   inflight the calls that passed the gate; closing waits (DRAIN_NS) until they are out,
 *            with the GIL released, so none is inside Python when the interpreter goes.
 * A call checks `closing` after counting itself in, and the closer sets `closing` before
 * reading the count (both sequentially consistent), so either the call backs out or the
 * closer waits for it. PyGILState_Ensure is never called on an interpreter that is
 * finalizing or finalized: there it kills the calling thread or touches freed state. */
enum { UNTRIED, READY, UNAVAILABLE };
static atomic_int state = UNTRIED;
static atomic_int closing;
static atomic_int inflight;
static int registered;       /* our atexit callable is in Python's atexit (under the GIL) */
static int c_atexit_set;     /* under init_lock */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static PyObject *bridge;     /* the module, imported under the GIL at first call */

static void complain(const char *what) {
    fprintf(stderr, "libneuralnetworks (nnhal): %s\n", what);
}

static int resolve(void *lib) {
#define SYM(field, name)                                               \
    do {                                                               \
        *(void **)&py.field = dlsym(lib, name);                        \
        if (!py.field) {                                               \
            complain("libpython lacks " name);                         \
            return 0;                                                  \
        }                                                              \
    } while (0)
#define OPTIONAL(field, name, old)                                     \
    do {                                                               \
        *(void **)&py.field = dlsym(lib, name);                        \
        if (!py.field)                                                 \
            *(void **)&py.field = dlsym(lib, old);                     \
    } while (0)
    SYM(IsInitialized, "Py_IsInitialized");
    OPTIONAL(IsFinalizing, "Py_IsFinalizing", "_Py_IsFinalizing");  /* public since 3.13 */
    OPTIONAL(UncheckedGet, "PyThreadState_GetUnchecked", "_PyThreadState_UncheckedGet");
    SYM(GILState_GetThisThreadState, "PyGILState_GetThisThreadState");
    SYM(GILState_Ensure, "PyGILState_Ensure");
    SYM(GILState_Release, "PyGILState_Release");
    SYM(Eval_SaveThread, "PyEval_SaveThread");
    SYM(Eval_RestoreThread, "PyEval_RestoreThread");
    SYM(Config_InitPythonConfig, "PyConfig_InitPythonConfig");
    SYM(Config_SetBytesString, "PyConfig_SetBytesString");
    SYM(Config_Clear, "PyConfig_Clear");
    SYM(InitializeFromConfig, "Py_InitializeFromConfig");
    SYM(Status_Exception, "PyStatus_Exception");
    SYM(Import_ImportModule, "PyImport_ImportModule");
    SYM(Object_GetAttrString, "PyObject_GetAttrString");
    SYM(Object_CallObject, "PyObject_CallObject");
    SYM(VaBuildValue, "Py_VaBuildValue");
    SYM(Long_AsLongLong, "PyLong_AsLongLong");
    SYM(Err_Occurred, "PyErr_Occurred");
    SYM(Err_Print, "PyErr_Print");
    SYM(DecRef, "Py_DecRef");
    SYM(Sys_GetObject, "PySys_GetObject");
    SYM(List_Insert, "PyList_Insert");
    SYM(Unicode_DecodeFSDefault, "PyUnicode_DecodeFSDefault");
    SYM(CFunction_NewEx, "PyCFunction_NewEx");
#undef OPTIONAL
#undef SYM
    return 1;
}

/* Whether the interpreter can take a call now: running and not finalizing. */
static int alive(void) {
    return py.IsInitialized() && !(py.IsFinalizing && py.IsFinalizing());
}

static PyObject *build(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *r = py.VaBuildValue(fmt, ap);
    va_end(ap);
    return r;
}

/* Mark closing, then wait (bounded) for the calls already inside to come out. */
static void close_and_drain(void) {
    atomic_store(&closing, 1);
    struct timespec nap = {0, 1000000};
    for (long long waited = 0; atomic_load(&inflight) > 0 && waited < DRAIN_NS;
         waited += nap.tv_nsec)
        nanosleep(&nap, NULL);
}

/* Python's atexit runs this with the GIL held, before the interpreter starts finalizing. */
static PyObject *closer(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyThreadState *ts = py.Eval_SaveThread();   /* let the calls inside finish */
    close_and_drain();
    py.Eval_RestoreThread(ts);
    return build("");                          /* None */
}

static PyMethodDef closer_def = {"nnhal_capi_close", closer, METH_NOARGS,
                                 "libneuralnetworks: no NNAPI call enters Python from now on"};

/* Put `closer` into Python's atexit; the GIL is held. */
static void register_closer(void) {
    if (registered)
        return;
    registered = 1;
    PyObject *mod = py.Import_ImportModule("atexit");
    PyObject *reg = mod ? py.Object_GetAttrString(mod, "register") : NULL;
    PyObject *fn = reg ? py.CFunction_NewEx(&closer_def, NULL, NULL) : NULL;
    PyObject *args = fn ? build("(O)", fn) : NULL;
    PyObject *res = args ? py.Object_CallObject(reg, args) : NULL;
    PyObject *objs[] = {res, args, fn, reg, mod};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        if (objs[i])
            py.DecRef(objs[i]);
    if (py.Err_Occurred())
        py.Err_Print();
}

/* C's exit(): atexit handlers (C++ static destructors among them) registered before this one
 * run after it and find the library closed; then the shared libraries' destructors run
 * (numpy's, OpenBLAS's), which no call may be inside of. */
static void c_exit_closer(void) {
    if (!atomic_load(&closing))
        close_and_drain();
}

/* The python of the environment this library was installed into: the library sits in
 * PREFIX/lib/pythonX.Y/site-packages/nnhal/capi/lib/, so PREFIX/bin/python3. */
static int find_python(char *out, size_t size) {
    if (NNHAL_EXECUTABLE[0]) {
        snprintf(out, size, "%s", NNHAL_EXECUTABLE);
        return 1;
    }
    Dl_info info;
    char path[PATH_MAX];
    if (!dladdr((void *)&find_python, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, path))
        return 0;
    char *sp = strstr(path, "/site-packages/");
    if (!sp)
        sp = strstr(path, "/dist-packages/");
    if (!sp)
        return 0;
    *sp = '\0';                                /* PREFIX/lib/pythonX.Y */
    for (int up = 0; up < 2; up++) {           /* -> PREFIX */
        char *slash = strrchr(path, '/');
        if (!slash || slash == path)
            return 0;
        *slash = '\0';
    }
    static const char *names[] = {"python3", "python"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(out, size, "%s/bin/%s", path, names[i]);
        if (access(out, X_OK) == 0)
            return 1;
    }
    return 0;
}

static int start_python(void) {
    char exe[PATH_MAX];
    if (!find_python(exe, sizeof exe)) {
        complain("cannot find the Python environment this library belongs to (it is not "
                 "inside a site-packages folder and was not built for one)");
        return 0;
    }
    PyConfig config;
    py.Config_InitPythonConfig(&config);
    config.install_signal_handlers = 0;   /* the program's signals stay the program's */
    config.parse_argv = 0;
    PyStatus st = py.Config_SetBytesString(&config, &config.program_name, exe);
    if (!py.Status_Exception(st))
        st = py.InitializeFromConfig(&config);
    py.Config_Clear(&config);
    if (py.Status_Exception(st)) {
        complain(st.err_msg ? st.err_msg : "Python failed to start");
        return 0;
    }
    if (NNHAL_SYSPATH[0]) {
        PyObject *path = py.Sys_GetObject("path");   /* borrowed */
        PyObject *entry = py.Unicode_DecodeFSDefault(NNHAL_SYSPATH);
        if (!path || !entry || py.List_Insert(path, 0, entry) < 0)
            py.Err_Print();
        if (entry)
            py.DecRef(entry);
    }
    py.Eval_SaveThread();   /* any thread, this one included, now takes the GIL per call */
    return 1;
}

/* Under init_lock: READY, UNAVAILABLE, or UNTRIED when the host's Python is not running
 * (not started yet, or finalized): then nothing is started here, since a second start in a
 * process that owns its Python would take the interpreter from under its host. The library
 * never finalizes an interpreter, its own included. */
static int try_attach(void) {
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized")) {
        if (!resolve(RTLD_DEFAULT))
            return UNAVAILABLE;
        return alive() ? READY : UNTRIED;   /* inside a Python process: use its interpreter */
    }
    if (!NNHAL_LIBPYTHON[0]) {
        complain("built against a Python without a shared libpython: this library works "
                 "only inside a running Python process");
        return UNAVAILABLE;
    }
    void *lib = dlopen(NNHAL_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        const char *base = strrchr(NNHAL_LIBPYTHON, '/');
        lib = dlopen(base ? base + 1 : NNHAL_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    }
    if (!lib) {
        complain(dlerror());
        return UNAVAILABLE;
    }
    if (!resolve(lib))
        return UNAVAILABLE;
    if (py.IsInitialized())
        return alive() ? READY : UNTRIED;
    return start_python() ? READY : UNAVAILABLE;
}

static int attach(void) {
    pthread_mutex_lock(&init_lock);
    int s = atomic_load(&state);
    if (s == UNTRIED && !atomic_load(&closing)) {
        s = try_attach();
        if (s == READY && !c_atexit_set)
            c_atexit_set = atexit(c_exit_closer) == 0;
        atomic_store(&state, s);
    }
    pthread_mutex_unlock(&init_lock);
    return s;
}

/* Loaded by ctypes, the loading thread holds the GIL: register the closer now, so a native
 * thread whose first call races the host's shutdown is drained like any other. */
__attribute__((constructor)) static void loaded(void) {
    int (*running)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    if (!running || !running() || attach() != READY || !py.UncheckedGet)
        return;
    PyThreadState *mine = py.GILState_GetThisThreadState();
    if (mine && py.UncheckedGet() == mine)
        register_closer();
}

/* Call bridge.NAME(*args), args built from FMT as by Py_BuildValue. FALLBACK is the answer
 * when no Python can ever run here, CLOSED when it cannot run now (not started by its host
 * yet, finalizing, finalized, or the process exiting). */
static long long nn_call(const char *name, long long fallback, long long closed,
                         const char *fmt, ...) {
    if (atomic_load(&closing))
        return closed;
    int s = atomic_load(&state);
    if (s != READY)
        s = attach();
    if (s != READY)
        return s == UNAVAILABLE ? fallback : closed;
    atomic_fetch_add(&inflight, 1);
    if (atomic_load(&closing) || !alive()) {
        atomic_fetch_sub(&inflight, 1);
        return closed;
    }
    long long result = fallback;
    PyGILState_STATE gil = py.GILState_Ensure();
    register_closer();
    if (!bridge)
        bridge = py.Import_ImportModule(BRIDGE);   /* kept for the process's lifetime */
    if (bridge) {
        va_list ap;
        va_start(ap, fmt);
        PyObject *args = py.VaBuildValue(fmt, ap);
        va_end(ap);
        PyObject *fn = args ? py.Object_GetAttrString(bridge, name) : NULL;
        PyObject *res = fn ? py.Object_CallObject(fn, args) : NULL;
        if (res) {
            long long r = py.Long_AsLongLong(res);
            if (!py.Err_Occurred())
                result = r;
            py.DecRef(res);
        }
        if (fn)
            py.DecRef(fn);
        if (args)
            py.DecRef(args);
    }
    if (py.Err_Occurred())
        py.Err_Print();   /* logged to stderr, cleared: nothing crosses into C */
    py.GILState_Release(gil);
    atomic_fetch_sub(&inflight, 1);
    return result;
}

#include "wrappers.inc"
