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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static struct {
    int (*IsInitialized)(void);
    PyGILState_STATE (*GILState_Ensure)(void);
    void (*GILState_Release)(PyGILState_STATE);
    PyThreadState *(*Eval_SaveThread)(void);
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
} py;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ready;            /* py filled and an interpreter running */
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
    SYM(IsInitialized, "Py_IsInitialized");
    SYM(GILState_Ensure, "PyGILState_Ensure");
    SYM(GILState_Release, "PyGILState_Release");
    SYM(Eval_SaveThread, "PyEval_SaveThread");
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
#undef SYM
    return 1;
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

static void init(void) {
    void *running = dlsym(RTLD_DEFAULT, "Py_IsInitialized");
    if (running && ((int (*)(void))running)()) {
        ready = resolve(RTLD_DEFAULT);   /* inside a Python process: use its interpreter */
        return;
    }
    if (!NNHAL_LIBPYTHON[0]) {
        complain("built against a Python without a shared libpython: this library works "
                 "only inside a running Python process");
        return;
    }
    void *lib = dlopen(NNHAL_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        const char *base = strrchr(NNHAL_LIBPYTHON, '/');
        lib = dlopen(base ? base + 1 : NNHAL_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    }
    if (!lib) {
        complain(dlerror());
        return;
    }
    if (!resolve(lib))
        return;
    ready = py.IsInitialized() ? 1 : start_python();
}

/* Call bridge.NAME(*args); args built from FMT as by Py_BuildValue. */
static long long nn_call(const char *name, long long fallback, const char *fmt, ...) {
    pthread_once(&once, init);
    if (!ready)
        return fallback;
    long long result = fallback;
    PyGILState_STATE gil = py.GILState_Ensure();
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
    return result;
}

#include "wrappers.inc"
