/* Helpers of nnhal's C API tests: build small models through NeuralNetworks.h. */
#ifndef NNHAL_TEST_COMMON_H
#define NNHAL_TEST_COMMON_H

#include <stdio.h>
#include <string.h>

#include "NeuralNetworks.h"

static int failures __attribute__((unused));

#define CHECK(x)                                                                   \
    do {                                                                           \
        int rc_ = (x);                                                             \
        if (rc_ != ANEURALNETWORKS_NO_ERROR) {                                     \
            printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, rc_);           \
            return 1;                                                              \
        }                                                                          \
    } while (0)

#define EXPECT(x, want)                                                            \
    do {                                                                           \
        long long got_ = (long long)(x), want_ = (long long)(want);                \
        if (got_ != want_) {                                                       \
            printf("FAIL %s:%d %s = %lld, expected %lld\n", __FILE__, __LINE__, #x, \
                   got_, want_);                                                   \
            failures++;                                                            \
        }                                                                          \
    } while (0)

/* out = in0 + in1 on 2x2 tensors of `type` (scale/zero point of all three given). */
static inline int build_add(ANeuralNetworksModel** model, int32_t type, float scale, int32_t zp,
                     float out_scale, int32_t out_zp) {
    static const uint32_t dims[2] = {2, 2};
    ANeuralNetworksOperandType t = {type, 2, dims, scale, zp};
    ANeuralNetworksOperandType o = {type, 2, dims, out_scale, out_zp};
    ANeuralNetworksOperandType s = {ANEURALNETWORKS_INT32, 0, NULL, 0.f, 0};
    CHECK(ANeuralNetworksModel_create(model));
    CHECK(ANeuralNetworksModel_addOperand(*model, &t));
    CHECK(ANeuralNetworksModel_addOperand(*model, &t));
    CHECK(ANeuralNetworksModel_addOperand(*model, &s));
    CHECK(ANeuralNetworksModel_addOperand(*model, &o));
    int32_t act = ANEURALNETWORKS_FUSED_NONE;
    CHECK(ANeuralNetworksModel_setOperandValue(*model, 2, &act, sizeof act));
    uint32_t in[3] = {0, 1, 2}, out[1] = {3};
    CHECK(ANeuralNetworksModel_addOperation(*model, ANEURALNETWORKS_ADD, 3, in, 1, out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(*model, 2, in, 1, out));
    CHECK(ANeuralNetworksModel_finish(*model));
    return 0;
}

static inline int float_add_compilation(ANeuralNetworksModel** model,
                                 ANeuralNetworksCompilation** comp) {
    if (build_add(model, ANEURALNETWORKS_TENSOR_FLOAT32, 0.f, 0, 0.f, 0))
        return 1;
    CHECK(ANeuralNetworksCompilation_create(*model, comp));
    CHECK(ANeuralNetworksCompilation_finish(*comp));
    return 0;
}

static inline int find_device(const char* wanted, ANeuralNetworksDevice** found) {
    uint32_t n = 0;
    CHECK(ANeuralNetworks_getDeviceCount(&n));
    for (uint32_t i = 0; i < n; i++) {
        ANeuralNetworksDevice* d = NULL;
        const char* name = NULL;
        CHECK(ANeuralNetworks_getDevice(i, &d));
        CHECK(ANeuralNetworksDevice_getName(d, &name));
        if (strcmp(name, wanted) == 0) {
            *found = d;
            return 0;
        }
    }
    printf("FAIL no device %s among %u\n", wanted, n);
    return 1;
}

#endif
