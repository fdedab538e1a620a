/* Models through the C API: float and quantized ADD, CONV_2D, a WHILE loop, timing, output shapes, events,
 * fenced dependencies, bursts, memory from an fd and from a memory descriptor. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

static const float A[4] = {1, 2, 3, 4}, B[4] = {10, 20, 30, 40};

static int check_sum(const float* c, const char* what) {
    for (int i = 0; i < 4; i++)
        if (c[i] != A[i] + B[i]) {
            printf("FAIL %s: out[%d] = %g, expected %g\n", what, i, c[i], A[i] + B[i]);
            failures++;
            return 1;
        }
    printf("ok %s\n", what);
    return 0;
}

static int float_add(void) {
    ANeuralNetworksModel* model;
    ANeuralNetworksDevice* ref;
    ANeuralNetworksCompilation* comp;
    if (build_add(&model, ANEURALNETWORKS_TENSOR_FLOAT32, 0.f, 0, 0.f, 0) ||
        find_device("reference", &ref))
        return 1;
    int32_t type = -1;
    int64_t level = 0;
    const char* version = NULL;
    CHECK(ANeuralNetworksDevice_getType(ref, &type));
    CHECK(ANeuralNetworksDevice_getFeatureLevel(ref, &level));
    CHECK(ANeuralNetworksDevice_getVersion(ref, &version));
    EXPECT(type, ANEURALNETWORKS_DEVICE_CPU);
    EXPECT(level, ANEURALNETWORKS_FEATURE_LEVEL_8);  /* the reference driver: AIDL v4 */
    EXPECT(version != NULL && version[0] != '\0', 1);
    const ANeuralNetworksDevice* devs[1] = {ref};
    bool supported[1] = {false};
    CHECK(ANeuralNetworksModel_getSupportedOperationsForDevices(model, devs, 1, supported));
    EXPECT(supported[0], 1);
    CHECK(ANeuralNetworksCompilation_createForDevices(model, devs, 1, &comp));
    CHECK(ANeuralNetworksCompilation_setPreference(comp, ANEURALNETWORKS_PREFER_SUSTAINED_SPEED));
    CHECK(ANeuralNetworksCompilation_setPriority(comp, ANEURALNETWORKS_PRIORITY_HIGH));
    CHECK(ANeuralNetworksCompilation_finish(comp));

    /* compute, timing, output shape; the output buffer is written only within its length */
    ANeuralNetworksExecution* ex;
    float c[5] = {0, 0, 0, 0, -7};
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, c, 4 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_setMeasureTiming(ex, true));
    CHECK(ANeuralNetworksExecution_compute(ex));
    check_sum(c, "compute");
    EXPECT(c[4], -7);
    uint32_t rank = 0, dims[2] = {0, 0};
    CHECK(ANeuralNetworksExecution_getOutputOperandRank(ex, 0, &rank));
    CHECK(ANeuralNetworksExecution_getOutputOperandDimensions(ex, 0, dims));
    EXPECT(rank, 2);
    EXPECT(dims[0], 2);
    EXPECT(dims[1], 2);
    uint64_t on_hw = 0, in_driver = 0;
    CHECK(ANeuralNetworksExecution_getDuration(ex, ANEURALNETWORKS_DURATION_ON_HARDWARE, &on_hw));
    CHECK(ANeuralNetworksExecution_getDuration(ex, ANEURALNETWORKS_DURATION_IN_DRIVER,
                                               &in_driver));
    EXPECT(in_driver != UINT64_MAX && in_driver > 0, 1);
    EXPECT(on_hw != UINT64_MAX && on_hw <= in_driver, 1);
    printf("ok timing on_hardware=%llu in_driver=%llu ns\n", (unsigned long long)on_hw,
           (unsigned long long)in_driver);
    ANeuralNetworksExecution_free(ex);

    /* startCompute, then a fenced execution depending on its event */
    ANeuralNetworksExecution *ex1, *ex2;
    ANeuralNetworksEvent *ev1, *ev2;
    float c1[4] = {0}, c2[4] = {0};
    CHECK(ANeuralNetworksExecution_create(comp, &ex1));
    CHECK(ANeuralNetworksExecution_setInput(ex1, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex1, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex1, 0, NULL, c1, sizeof c1));
    CHECK(ANeuralNetworksExecution_startCompute(ex1, &ev1));
    CHECK(ANeuralNetworksExecution_create(comp, &ex2));
    CHECK(ANeuralNetworksExecution_setInput(ex2, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex2, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex2, 0, NULL, c2, sizeof c2));
    const ANeuralNetworksEvent* deps[1] = {ev1};
    CHECK(ANeuralNetworksExecution_startComputeWithDependencies(ex2, deps, 1, 0, &ev2));
    CHECK(ANeuralNetworksEvent_wait(ev2));
    CHECK(ANeuralNetworksEvent_wait(ev1));
    check_sum(c1, "startCompute");
    check_sum(c2, "startComputeWithDependencies");
    ANeuralNetworksEvent_free(ev1);
    ANeuralNetworksEvent_free(ev2);
    ANeuralNetworksExecution_free(ex1);
    ANeuralNetworksExecution_free(ex2);

    /* a burst, three executions; a reusable execution computed twice */
    ANeuralNetworksBurst* burst;
    CHECK(ANeuralNetworksBurst_create(comp, &burst));
    for (int k = 0; k < 3; k++) {
        float cb[4] = {0};
        CHECK(ANeuralNetworksExecution_create(comp, &ex));
        CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, A, sizeof A));
        CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
        CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, cb, sizeof cb));
        CHECK(ANeuralNetworksExecution_burstCompute(ex, burst));
        check_sum(cb, "burstCompute");
        ANeuralNetworksExecution_free(ex);
    }
    ANeuralNetworksBurst_free(burst);
    float cr[4];
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setReusable(ex, true));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, cr, sizeof cr));
    for (int k = 0; k < 2; k++) {
        memset(cr, 0, sizeof cr);
        CHECK(ANeuralNetworksExecution_compute(ex));
        check_sum(cr, "reusable compute");
    }
    ANeuralNetworksExecution_free(ex);

    /* memory from an fd (memfd): inputs and output in one pool */
    int fd = memfd_create("nnhal-test", 0);
    if (fd < 0 || ftruncate(fd, 64) != 0) {
        printf("FAIL memfd\n");
        return 1;
    }
    if (pwrite(fd, A, sizeof A, 0) != sizeof A || pwrite(fd, B, sizeof B, 16) != sizeof B)
        return 1;
    ANeuralNetworksMemory* mem;
    CHECK(ANeuralNetworksMemory_createFromFd(64, PROT_READ | PROT_WRITE, fd, 0, &mem));
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(ex, 0, NULL, mem, 0, 16));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(ex, 1, NULL, mem, 16, 16));
    CHECK(ANeuralNetworksExecution_setOutputFromMemory(ex, 0, NULL, mem, 32, 16));
    CHECK(ANeuralNetworksExecution_compute(ex));
    ANeuralNetworksExecution_free(ex);
    float cm[4] = {0};
    if (pread(fd, cm, sizeof cm, 32) != sizeof cm)
        return 1;
    check_sum(cm, "memory from fd");

    /* a memory from a descriptor: output of one execution, input of the next, then copied
     * into the fd memory */
    ANeuralNetworksMemoryDesc* desc;
    ANeuralNetworksMemory* dmem;
    const uint32_t ddims[2] = {2, 2};
    CHECK(ANeuralNetworksMemoryDesc_create(&desc));
    CHECK(ANeuralNetworksMemoryDesc_addInputRole(desc, comp, 0, 1.f));
    CHECK(ANeuralNetworksMemoryDesc_addOutputRole(desc, comp, 0, 1.f));
    CHECK(ANeuralNetworksMemoryDesc_setDimensions(desc, 2, ddims));
    CHECK(ANeuralNetworksMemoryDesc_finish(desc));
    CHECK(ANeuralNetworksMemory_createFromDesc(desc, &dmem));
    ANeuralNetworksMemoryDesc_free(desc);
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, A, sizeof A));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutputFromMemory(ex, 0, NULL, dmem, 0, 0));
    CHECK(ANeuralNetworksExecution_compute(ex));
    ANeuralNetworksExecution_free(ex);
    float cd[4] = {0};
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(ex, 0, NULL, dmem, 0, 0));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, B, sizeof B));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, cd, sizeof cd));
    CHECK(ANeuralNetworksExecution_compute(ex));
    ANeuralNetworksExecution_free(ex);
    for (int i = 0; i < 4; i++)
        EXPECT(cd[i], A[i] + 2 * B[i]);
    int fd2 = memfd_create("nnhal-copy", 0);
    ANeuralNetworksMemory* mem2;
    if (fd2 < 0 || ftruncate(fd2, 16) != 0)
        return 1;
    CHECK(ANeuralNetworksMemory_createFromFd(16, PROT_READ | PROT_WRITE, fd2, 0, &mem2));
    CHECK(ANeuralNetworksMemory_copy(dmem, mem2));
    float cc[4] = {0};
    if (pread(fd2, cc, sizeof cc, 0) != sizeof cc)
        return 1;
    check_sum(cc, "memory from a descriptor, copied to an fd memory");
    ANeuralNetworksMemory_free(mem2);
    close(fd2);
    ANeuralNetworksMemory_free(dmem);
    ANeuralNetworksMemory_free(mem);
    close(fd);
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    return 0;
}

static int quant8_add(void) {
    ANeuralNetworksModel* model;
    ANeuralNetworksCompilation* comp;
    ANeuralNetworksExecution* ex;
    /* real = (q - 10) * 0.5 for the inputs, q * 1.0 for the output */
    if (build_add(&model, ANEURALNETWORKS_TENSOR_QUANT8_ASYMM, 0.5f, 10, 1.f, 0))
        return 1;
    CHECK(ANeuralNetworksCompilation_create(model, &comp));
    CHECK(ANeuralNetworksCompilation_finish(comp));
    const uint8_t qa[4] = {12, 14, 20, 30}, qb[4] = {10, 12, 16, 18};
    uint8_t qc[4] = {0};
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, qa, sizeof qa));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, qb, sizeof qb));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, qc, sizeof qc));
    CHECK(ANeuralNetworksExecution_compute(ex));
    const uint8_t want[4] = {1, 3, 8, 14};
    for (int i = 0; i < 4; i++)
        EXPECT(qc[i], want[i]);
    printf("ok quant8 add\n");
    ANeuralNetworksExecution_free(ex);
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    return 0;
}

static int conv2d(void) {
    /* 1x3x3x1 input, 2x2 filter of ones, VALID padding, stride 1 -> 1x2x2x1 */
    const uint32_t din[4] = {1, 3, 3, 1}, dfil[4] = {1, 2, 2, 1}, dbias[1] = {1},
                   dout[4] = {1, 2, 2, 1};
    ANeuralNetworksOperandType tin = {ANEURALNETWORKS_TENSOR_FLOAT32, 4, din, 0.f, 0};
    ANeuralNetworksOperandType tfil = {ANEURALNETWORKS_TENSOR_FLOAT32, 4, dfil, 0.f, 0};
    ANeuralNetworksOperandType tbias = {ANEURALNETWORKS_TENSOR_FLOAT32, 1, dbias, 0.f, 0};
    ANeuralNetworksOperandType tout = {ANEURALNETWORKS_TENSOR_FLOAT32, 4, dout, 0.f, 0};
    ANeuralNetworksOperandType s = {ANEURALNETWORKS_INT32, 0, NULL, 0.f, 0};
    ANeuralNetworksModel* model;
    CHECK(ANeuralNetworksModel_create(&model));
    CHECK(ANeuralNetworksModel_addOperand(model, &tin));    /* 0 */
    CHECK(ANeuralNetworksModel_addOperand(model, &tfil));   /* 1 */
    CHECK(ANeuralNetworksModel_addOperand(model, &tbias));  /* 2 */
    for (int i = 0; i < 4; i++)
        CHECK(ANeuralNetworksModel_addOperand(model, &s));  /* 3 padding, 4-5 strides, 6 act */
    CHECK(ANeuralNetworksModel_addOperand(model, &tout));   /* 7 */
    const float filter[4] = {1, 1, 1, 1}, bias[1] = {0.5f};
    const int32_t pad = ANEURALNETWORKS_PADDING_VALID, one = 1, act = ANEURALNETWORKS_FUSED_RELU;
    CHECK(ANeuralNetworksModel_setOperandValue(model, 1, filter, sizeof filter));
    CHECK(ANeuralNetworksModel_setOperandValue(model, 2, bias, sizeof bias));
    CHECK(ANeuralNetworksModel_setOperandValue(model, 3, &pad, sizeof pad));
    CHECK(ANeuralNetworksModel_setOperandValue(model, 4, &one, sizeof one));
    CHECK(ANeuralNetworksModel_setOperandValue(model, 5, &one, sizeof one));
    CHECK(ANeuralNetworksModel_setOperandValue(model, 6, &act, sizeof act));
    const uint32_t ins[7] = {0, 1, 2, 3, 4, 5, 6}, outs[1] = {7}, mins[1] = {0};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_CONV_2D, 7, ins, 1, outs));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, mins, 1, outs));
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* comp;
    ANeuralNetworksExecution* ex;
    CHECK(ANeuralNetworksCompilation_create(model, &comp));
    CHECK(ANeuralNetworksCompilation_finish(comp));
    const float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float y[4] = {0};
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, x, sizeof x));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, y, sizeof y));
    CHECK(ANeuralNetworksExecution_compute(ex));
    const float want[4] = {12.5f, 16.5f, 24.5f, 28.5f};
    for (int i = 0; i < 4; i++)
        EXPECT(y[i], want[i]);
    uint32_t od[4] = {0};
    CHECK(ANeuralNetworksExecution_getOutputOperandDimensions(ex, 0, od));
    EXPECT(od[1] * 10 + od[2], 22);
    printf("ok conv2d\n");
    ANeuralNetworksExecution_free(ex);
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    return 0;
}

/* while (i < n) i = i + 1, with i and n TENSOR_FLOAT32 [1]: a WHILE whose condition and body
 * are models given with setOperandValueFromModel. */
static int while_loop(void) {
    const uint32_t one_dim[1] = {1};
    ANeuralNetworksOperandType f = {ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dim, 0.f, 0};
    ANeuralNetworksOperandType b8 = {ANEURALNETWORKS_TENSOR_BOOL8, 1, one_dim, 0.f, 0};
    ANeuralNetworksOperandType s = {ANEURALNETWORKS_INT32, 0, NULL, 0.f, 0};
    ANeuralNetworksOperandType sub = {ANEURALNETWORKS_MODEL, 0, NULL, 0.f, 0};
    ANeuralNetworksModel *cond, *body, *model;
    const uint32_t io[2] = {0, 1}, two[1] = {2};
    /* cond(i, n) = i < n */
    CHECK(ANeuralNetworksModel_create(&cond));
    CHECK(ANeuralNetworksModel_addOperand(cond, &f));
    CHECK(ANeuralNetworksModel_addOperand(cond, &f));
    CHECK(ANeuralNetworksModel_addOperand(cond, &b8));
    CHECK(ANeuralNetworksModel_addOperation(cond, ANEURALNETWORKS_LESS, 2, io, 1, two));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(cond, 2, io, 1, two));
    CHECK(ANeuralNetworksModel_finish(cond));
    /* body(i, n) = i + 1 */
    CHECK(ANeuralNetworksModel_create(&body));
    CHECK(ANeuralNetworksModel_addOperand(body, &f));  /* 0 i */
    CHECK(ANeuralNetworksModel_addOperand(body, &f));  /* 1 n */
    CHECK(ANeuralNetworksModel_addOperand(body, &f));  /* 2 one */
    CHECK(ANeuralNetworksModel_addOperand(body, &s));  /* 3 act */
    CHECK(ANeuralNetworksModel_addOperand(body, &f));  /* 4 i + 1 */
    const float one = 1.f;
    const int32_t act = ANEURALNETWORKS_FUSED_NONE;
    CHECK(ANeuralNetworksModel_setOperandValue(body, 2, &one, sizeof one));
    CHECK(ANeuralNetworksModel_setOperandValue(body, 3, &act, sizeof act));
    const uint32_t add_in[3] = {0, 2, 3}, add_out[1] = {4};
    CHECK(ANeuralNetworksModel_addOperation(body, ANEURALNETWORKS_ADD, 3, add_in, 1, add_out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(body, 2, io, 1, add_out));
    CHECK(ANeuralNetworksModel_finish(body));
    /* main(i0, n) = WHILE(cond, body, i0, n) */
    CHECK(ANeuralNetworksModel_create(&model));
    CHECK(ANeuralNetworksModel_addOperand(model, &f));    /* 0 i0 */
    CHECK(ANeuralNetworksModel_addOperand(model, &f));    /* 1 n */
    CHECK(ANeuralNetworksModel_addOperand(model, &sub));  /* 2 cond */
    CHECK(ANeuralNetworksModel_addOperand(model, &sub));  /* 3 body */
    CHECK(ANeuralNetworksModel_addOperand(model, &f));    /* 4 i */
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(model, 2, cond));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(model, 3, body));
    const uint32_t w_in[4] = {2, 3, 0, 1}, w_out[1] = {4};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_WHILE, 4, w_in, 1, w_out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, io, 1, w_out));
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* comp;
    ANeuralNetworksExecution* ex;
    CHECK(ANeuralNetworksCompilation_create(model, &comp));
    CHECK(ANeuralNetworksCompilation_finish(comp));
    const float i0 = 0.f, n = 5.f;
    float out = -1.f;
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    CHECK(ANeuralNetworksExecution_setLoopTimeout(ex, ANeuralNetworks_getDefaultLoopTimeout()));
    CHECK(ANeuralNetworksExecution_setInput(ex, 0, NULL, &i0, sizeof i0));
    CHECK(ANeuralNetworksExecution_setInput(ex, 1, NULL, &n, sizeof n));
    CHECK(ANeuralNetworksExecution_setOutput(ex, 0, NULL, &out, sizeof out));
    CHECK(ANeuralNetworksExecution_compute(ex));
    EXPECT(out, 5);
    printf("ok while loop\n");
    ANeuralNetworksExecution_free(ex);
    ANeuralNetworksCompilation_free(comp);
    ANeuralNetworksModel_free(model);
    ANeuralNetworksModel_free(body);
    ANeuralNetworksModel_free(cond);
    return 0;
}

int main(void) {
    EXPECT(ANeuralNetworks_getRuntimeFeatureLevel(), ANEURALNETWORKS_FEATURE_LEVEL_8);
    EXPECT(ANeuralNetworks_getDefaultLoopTimeout(), 2000000000ULL);
    EXPECT(ANeuralNetworks_getMaximumLoopTimeout(), 15000000000ULL);
    if (float_add() || quant8_add() || conv2d() || while_loop())
        return 1;
    return failures ? 1 : 0;
}
