/* Eight threads at once: each builds, compiles and runs its own model, and all of them also
 * run executions of one shared compilation. */
#include <pthread.h>
#include <stdint.h>

#include "common.h"

enum { THREADS = 8, RUNS = 10 };
static ANeuralNetworksCompilation* shared;
static int errors[THREADS];

static int run(ANeuralNetworksCompilation* comp, float base) {
    float a[4], b[4], c[4] = {0};
    for (int i = 0; i < 4; i++) {
        a[i] = base + (float)i;
        b[i] = 100.f * base;
    }
    ANeuralNetworksExecution* ex;
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, b, sizeof b));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, c, sizeof c));
    CHECK(ANeuralNetworksExecution_compute(ex));
    ANeuralNetworksExecution_free(ex);
    for (int i = 0; i < 4; i++)
        if (c[i] != a[i] + b[i])
            return 1;
    return 0;
}

static void* worker(void* arg) {
    int id = (int)(intptr_t)arg;
    ANeuralNetworksModel* model;
    ANeuralNetworksCompilation* comp;
    if (float_add_compilation(&model, &comp)) {
        errors[id]++;
        return NULL;
    }
    for (int k = 0; k < RUNS; k++) {
        errors[id] += run(comp, (float)(id * RUNS + k));
        errors[id] += run(shared, (float)(-id * RUNS - k));
    }
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    return NULL;
}

int main(void) {
    ANeuralNetworksModel* model;
    if (float_add_compilation(&model, &shared))
        return 1;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void*)(intptr_t)i) != 0)
            return 1;
    int total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        total += errors[i];
    }
    printf("threads %d executions %d errors %d\n", THREADS, THREADS * RUNS * 2, total);
    return total ? 1 : 0;
}
