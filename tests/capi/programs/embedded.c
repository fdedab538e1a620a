/* A program that embeds Python itself: a call before Py_Initialize, calls while it runs,
 * calls after Py_Finalize, and frees from an atexit handler after that. */
#include <Python.h>
#include <stdlib.h>

#include "common.h"

static ANeuralNetworksModel* kept;

static void late_free(void) {
    ANeuralNetworksModel_free(kept);
}

int main(void) {
    ANeuralNetworksModel* m = NULL;
    printf("before %d\n", ANeuralNetworksModel_create(&m));
    Py_Initialize();
    printf("running %d\n", ANeuralNetworksModel_create(&kept));
    ANeuralNetworksModel* model = NULL;
    ANeuralNetworksCompilation* comp = NULL;
    printf("compile %d\n", float_add_compilation(&model, &comp));
    atexit(late_free);
    Py_Finalize();
    printf("after %d\n", ANeuralNetworksModel_create(&m));
    printf("finish %d\n", ANeuralNetworksModel_finish(kept));
    printf("level %lld\n", (long long)ANeuralNetworks_getRuntimeFeatureLevel());
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    return 0;
}
