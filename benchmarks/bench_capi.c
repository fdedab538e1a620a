/* One 2x2 float ADD per execution through libneuralnetworks.so, from C: create, set two
 * inputs and the output, compute, free. Prints the median microseconds per execution over
 * `rounds` rounds of `n` executions (argv[1], argv[2]). Used by bench_capi.py. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "NeuralNetworks.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5, n = argc > 2 ? atoi(argv[2]) : 200;
    const uint32_t dims[2] = {2, 2};
    ANeuralNetworksOperandType t = {ANEURALNETWORKS_TENSOR_FLOAT32, 2, dims, 0.f, 0};
    ANeuralNetworksOperandType s = {ANEURALNETWORKS_INT32, 0, NULL, 0.f, 0};
    ANeuralNetworksModel* m;
    ANeuralNetworksCompilation* c;
    ANeuralNetworksModel_create(&m);
    ANeuralNetworksModel_addOperand(m, &t);
    ANeuralNetworksModel_addOperand(m, &t);
    ANeuralNetworksModel_addOperand(m, &s);
    ANeuralNetworksModel_addOperand(m, &t);
    int32_t act = 0;
    ANeuralNetworksModel_setOperandValue(m, 2, &act, 4);
    uint32_t in[3] = {0, 1, 2}, out[1] = {3};
    ANeuralNetworksModel_addOperation(m, ANEURALNETWORKS_ADD, 3, in, 1, out);
    ANeuralNetworksModel_identifyInputsAndOutputs(m, 2, in, 1, out);
    if (ANeuralNetworksModel_finish(m) || ANeuralNetworksCompilation_create(m, &c) ||
        ANeuralNetworksCompilation_finish(c))
        return 1;
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, o[4];
    double* us = malloc(sizeof(double) * (size_t)rounds);
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++) {
            ANeuralNetworksExecution* e;
            ANeuralNetworksExecution_create(c, &e);
            ANeuralNetworksExecution_setInput(e, 0, NULL, a, sizeof a);
            ANeuralNetworksExecution_setInput(e, 1, NULL, b, sizeof b);
            ANeuralNetworksExecution_setOutput(e, 0, NULL, o, sizeof o);
            if (ANeuralNetworksExecution_compute(e))
                return 1;
            ANeuralNetworksExecution_free(e);
        }
        us[r] = (now() - t0) / n * 1e6;
    }
    qsort(us, (size_t)rounds, sizeof *us, cmp);
    printf("%.1f\n", us[rounds / 2]);
    return o[3] == 12.f ? 0 : 1;
}
