/* Loaded by a Python process with ctypes next to the library (which it reaches through
 * function pointers handed over, as a C++ extension would): native threads that call the
 * library in a loop, and a C atexit handler that frees after the interpreter has finalized. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "NeuralNetworks.h"

typedef int (*create_fn)(ANeuralNetworksModel**);
typedef void (*free_fn)(ANeuralNetworksModel*);
static create_fn create;
static free_fn release;
static ANeuralNetworksModel* kept;
static volatile int calls;

static void at_exit(void) {
    release(kept);
    ANeuralNetworksModel* m = NULL;
    if (create(&m) != ANEURALNETWORKS_BAD_STATE)
        _exit(3);
}

static void* caller(void* arg) {
    (void)arg;
    for (;;) {
        ANeuralNetworksModel* m = NULL;
        int rc = create(&m);
        if (rc != ANEURALNETWORKS_NO_ERROR && rc != ANEURALNETWORKS_BAD_STATE)
            _exit(4);
        __sync_fetch_and_add(&calls, 1);
        release(m);
    }
    return NULL;
}

void setup(void* c, void* f) {
    create = (create_fn)c;
    release = (free_fn)f;
    if (create(&kept) != ANEURALNETWORKS_NO_ERROR)
        _exit(5);
    atexit(at_exit);
}

/* Threads whose first call may come at any moment of the interpreter's shutdown. */
int start_callers(int n) {
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, caller, NULL) != 0)
            return -1;
        pthread_detach(t);
    }
    return 0;
}

int calls_made(void) {
    return calls;
}
