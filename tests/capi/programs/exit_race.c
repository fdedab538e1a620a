/* Native threads call the library in a loop while main() returns: exit() runs while calls are
 * in flight and more arrive, and an atexit handler registered before the library started
 * frees a model. Every call must answer NO_ERROR or BAD_STATE; the process must exit 0. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

enum { THREADS = 4 };
static ANeuralNetworksModel* kept;
static volatile int started;

static void late_free(void) {
    ANeuralNetworksModel_free(kept);          /* runs after the library closed: a no-op */
    ANeuralNetworksModel* m = NULL;
    int rc = ANeuralNetworksModel_create(&m);
    printf("after exit: create %d\n", rc);   /* BAD_STATE: no call enters Python now */
    if (rc != ANEURALNETWORKS_BAD_STATE)
        _exit(3);
}

static void* worker(void* arg) {
    (void)arg;
    for (;;) {
        ANeuralNetworksModel* m = NULL;
        int rc = ANeuralNetworksModel_create(&m);
        if (rc != ANEURALNETWORKS_NO_ERROR && rc != ANEURALNETWORKS_BAD_STATE)
            _exit(4);
        __sync_fetch_and_add(&started, 1);
        ANeuralNetworksModel_free(m);
    }
    return NULL;
}

int main(void) {
    atexit(late_free);                        /* before the library's own handler */
    CHECK(ANeuralNetworksModel_create(&kept));
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0)
            return 1;
    while (started < 20)
        usleep(1000);
    printf("returning with calls in flight\n");
    fflush(stdout);
    return 0;
}
