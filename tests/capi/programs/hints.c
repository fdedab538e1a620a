/* Feature level 8 from C: the runtime's and the reference device's levels, and both
 * addExtensionAttribute functions on the "hints" device (a plug-in the test installs, which
 * supports the extension com.example.hints and logs what it receives): the codes here, the
 * delivery to the driver checked by the test from the log. */
#include <stdint.h>

#include "common.h"

#define EXT "com.example.hints"

static const float A[4] = {1, 2, 3, 4}, B[4] = {10, 20, 30, 40};

int main(void) {
    EXPECT(ANeuralNetworks_getRuntimeFeatureLevel(), ANEURALNETWORKS_FEATURE_LEVEL_8);
    ANeuralNetworksDevice *ref, *hints;
    if (find_device("reference", &ref) || find_device("hints", &hints))
        return 1;
    int64_t level = 0;
    CHECK(ANeuralNetworksDevice_getFeatureLevel(ref, &level));
    EXPECT(level, ANEURALNETWORKS_FEATURE_LEVEL_8);
    EXPECT(level, 1000008);

    ANeuralNetworksModel* model;
    ANeuralNetworksCompilation *comp, *plain, *on_ref;
    if (build_add(&model, ANEURALNETWORKS_TENSOR_FLOAT32, 0.f, 0, 0.f, 0))
        return 1;
    const ANeuralNetworksDevice* devs[1] = {hints};
    CHECK(ANeuralNetworksCompilation_createForDevices(model, devs, 1, &comp));
    const uint8_t hint[2] = {1, 2};
    CHECK(ANeuralNetworksCompilation_addExtensionAttribute(comp, EXT, 7, hint, sizeof hint));
    CHECK(ANeuralNetworksCompilation_addExtensionAttribute(comp, EXT, 8, NULL, 0));
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(comp, EXT, 7, hint, 1),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(comp, "com.example.unknown", 1,
                                                            hint, 1),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(comp, NULL, 1, hint, 1),
           ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(comp, EXT, 1, NULL, 1),
           ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(NULL, EXT, 1, hint, 1),
           ANEURALNETWORKS_UNEXPECTED_NULL);
    CHECK(ANeuralNetworksCompilation_finish(comp));
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(comp, EXT, 9, hint, 1),
           ANEURALNETWORKS_BAD_STATE);

    ANeuralNetworksExecution* ex;
    float c[4] = {0};
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, c, sizeof c));
    CHECK(ANeuralNetworksExecution_addExtensionAttribute(ex, EXT, 3, "abc", 3));
    EXPECT(ANeuralNetworksExecution_addExtensionAttribute(ex, EXT, 3, "abc", 3),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_addExtensionAttribute(ex, EXT, 4, "abc", (size_t)1 << 40),
           ANEURALNETWORKS_BAD_DATA);
    CHECK(ANeuralNetworksExecution_compute(ex));
    for (int i = 0; i < 4; i++)
        EXPECT(c[i], A[i] + B[i]);
    EXPECT(ANeuralNetworksExecution_addExtensionAttribute(ex, EXT, 4, "abc", 3),
           ANEURALNETWORKS_BAD_STATE);
    ANeuralNetworksExecution_free(ex);

    /* Only a createForDevices compilation with one device takes attributes; any device of
     * the runtime may be given one whose extension another device supports. */
    CHECK(ANeuralNetworksCompilation_create(model, &plain));
    EXPECT(ANeuralNetworksCompilation_addExtensionAttribute(plain, EXT, 1, hint, 1),
           ANEURALNETWORKS_BAD_DATA);
    const ANeuralNetworksDevice* ref_only[1] = {ref};
    CHECK(ANeuralNetworksCompilation_createForDevices(model, ref_only, 1, &on_ref));
    CHECK(ANeuralNetworksCompilation_addExtensionAttribute(on_ref, EXT, 1, hint, 1));
    CHECK(ANeuralNetworksCompilation_finish(on_ref));
    ANeuralNetworksCompilation_free(on_ref);
    ANeuralNetworksCompilation_free(plain);
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    printf("ok: %d failures\n", failures);
    return failures != 0;
}
