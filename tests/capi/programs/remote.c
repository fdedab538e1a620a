/* A served driver from C: the device named in argv[1] (a name NNHAL_DEVICES gives the
 * library, e.g. remote:/tmp/ref.sock) runs a float ADD through createForDevices. */
#include <stdint.h>

#include "common.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        printf("FAIL usage: remote DEVICE-NAME\n");
        return 2;
    }
    static const float A[4] = {1, 2, 3, 4}, B[4] = {10, 20, 30, 40};
    ANeuralNetworksModel* model;
    ANeuralNetworksDevice* dev;
    ANeuralNetworksCompilation* comp;
    ANeuralNetworksExecution* ex;
    if (build_add(&model, ANEURALNETWORKS_TENSOR_FLOAT32, 0.f, 0, 0.f, 0) ||
        find_device(argv[1], &dev))
        return 1;
    const ANeuralNetworksDevice* devs[1] = {dev};
    CHECK(ANeuralNetworksCompilation_createForDevices(model, devs, 1, &comp));
    CHECK(ANeuralNetworksCompilation_finish(comp));
    float c[4] = {0};
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, c, sizeof c));
    CHECK(ANeuralNetworksExecution_compute(ex));
    for (int i = 0; i < 4; i++)
        EXPECT(c[i], A[i] + B[i]);
    ANeuralNetworksExecution_free(ex);
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    if (!failures)
        printf("ok add on %s\n", argv[1]);
    return failures != 0;
}
