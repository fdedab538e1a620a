/* Upstream's FibonacciExtensionTest in C, through NeuralNetworks.h and
 * NeuralNetworksExtensions.h: the com.example.fibonacci extension offered by one device (a
 * plug-in here, or served), the reference device for everything else. */
#include <stdbool.h>
#include <stdint.h>

#include "NeuralNetworksExtensions.h"
#include "common.h"

static const char kName[] = "com.example.fibonacci";
enum { EXAMPLE_INT64 = 0, EXAMPLE_TENSOR_QUANT64_ASYMM = 1 };
enum { EXAMPLE_FIBONACCI = 0 };
typedef struct { double scale; int64_t zeroPoint; } Quant64Params;

static const ANeuralNetworksDevice* devices[2]; /* the Fibonacci device, the reference one */
static const ANeuralNetworksDevice* every[16];
static uint32_t count;
static const int kFib[10] = {1, 1, 2, 3, 5, 8, 13, 21, 34, 55};

static int find_devices(void) {
    CHECK(ANeuralNetworks_getDeviceCount(&count));
    if (count > 16) count = 16;
    for (uint32_t i = 0; i < count; i++) {
        ANeuralNetworksDevice* d;
        CHECK(ANeuralNetworks_getDevice(i, &d));
        every[i] = d;
        bool has = true;
        CHECK(ANeuralNetworksDevice_getExtensionSupport(d, kName, &has));
        const char* name;
        CHECK(ANeuralNetworksDevice_getName(d, &name));
        if (has) {
            EXPECT(devices[0] == NULL, 1); /* one Fibonacci device */
            devices[0] = d;
        } else if (strcmp(name, "reference") == 0) {
            devices[1] = d;
        }
    }
    bool has = true;
    CHECK(ANeuralNetworksDevice_getExtensionSupport(devices[1], "com.example.unknown", &has));
    EXPECT(has, 0);
    EXPECT(ANeuralNetworksDevice_getExtensionSupport(devices[1], NULL, &has),
           ANEURALNETWORKS_UNEXPECTED_NULL);
    return devices[0] == NULL || devices[1] == NULL;
}

/* The operand count of a model, kept here (addOperand returns no index). */
static uint32_t n_operands;
static uint32_t operand(ANeuralNetworksModel* m, int32_t type, uint32_t rank,
                        const uint32_t* dims) {
    ANeuralNetworksOperandType t = {type, rank, rank ? dims : NULL, 0.f, 0};
    if (ANeuralNetworksModel_addOperand(m, &t) != ANEURALNETWORKS_NO_ERROR) {
        printf("FAIL addOperand type %d\n", type);
        failures++;
    }
    return n_operands++;
}

static int nop(ANeuralNetworksModel* m, const uint32_t* dims, uint32_t src, uint32_t dst) {
    static const float zeros[16] = {0};
    uint32_t z = operand(m, ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims);
    CHECK(ANeuralNetworksModel_setOperandValue(m, z, zeros, sizeof(float) * dims[0]));
    uint32_t act = operand(m, ANEURALNETWORKS_INT32, 0, NULL);
    int32_t none = ANEURALNETWORKS_FUSED_NONE;
    CHECK(ANeuralNetworksModel_setOperandValue(m, act, &none, sizeof none));
    uint32_t in[3] = {src, z, act};
    CHECK(ANeuralNetworksModel_addOperation(m, ANEURALNETWORKS_ADD, 3, in, 1, &dst));
    return 0;
}

/* [ADD ->] FIBONACCI [-> ADD], as upstream's createModel. */
static int build(ANeuralNetworksModel** m, int32_t in_t, uint32_t in_rank, const uint32_t* in_d,
                 int32_t out_t, uint32_t out_rank, const uint32_t* out_d, bool nops,
                 const Quant64Params* params, int32_t op_code) {
    n_operands = 0;
    CHECK(ANeuralNetworksModel_create(m));
    if (in_t < 0) CHECK(ANeuralNetworksModel_getExtensionOperandType(*m, kName, -in_t - 1, &in_t));
    if (out_t < 0)
        CHECK(ANeuralNetworksModel_getExtensionOperandType(*m, kName, -out_t - 1, &out_t));
    uint32_t fin = operand(*m, in_t, in_rank, in_d), fout = operand(*m, out_t, out_rank, out_d);
    if (params) CHECK(ANeuralNetworksModel_setOperandExtensionData(*m, fout, params, sizeof *params));
    uint32_t mi = nops ? operand(*m, in_t, in_rank, in_d) : fin;
    uint32_t mo = nops ? operand(*m, out_t, out_rank, out_d) : fout;
    if (nops && nop(*m, in_d, mi, fin)) return 1;
    ANeuralNetworksOperationType fib;
    CHECK(ANeuralNetworksModel_getExtensionOperationType(*m, kName, op_code, &fib));
    CHECK(ANeuralNetworksModel_addOperation(*m, fib, 1, &fin, 1, &fout));
    if (nops && nop(*m, out_d, fout, mo)) return 1;
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(*m, 1, &mi, 1, &mo));
    CHECK(ANeuralNetworksModel_finish(*m));
    return 0;
}

static void expect_supported(ANeuralNetworksModel* m, const ANeuralNetworksDevice** ds, uint32_t n,
                             const bool* want, uint32_t ops) {
    bool got[8] = {0};
    EXPECT(ANeuralNetworksModel_getSupportedOperationsForDevices(m, ds, n, got),
           ANEURALNETWORKS_NO_ERROR);
    for (uint32_t i = 0; i < ops; i++) EXPECT(got[i], want[i]);
}

static int run(ANeuralNetworksModel* m, const void* in, size_t in_n, void* out, size_t out_n) {
    ANeuralNetworksCompilation* c;
    ANeuralNetworksExecution* e;
    CHECK(ANeuralNetworksCompilation_createForDevices(m, devices, 2, &c));
    CHECK(ANeuralNetworksCompilation_finish(c));
    CHECK(ANeuralNetworksExecution_create(c, &e));
    CHECK(ANeuralNetworksExecution_setInput(e, 0, NULL, in, in_n));
    CHECK(ANeuralNetworksExecution_setOutput(e, 0, NULL, out, out_n));
    int rc = ANeuralNetworksExecution_compute(e);
    ANeuralNetworksExecution_free(e);
    ANeuralNetworksCompilation_free(c);
    return rc;
}

static int finish_fails(ANeuralNetworksModel* m) {
    ANeuralNetworksCompilation* c;
    CHECK(ANeuralNetworksCompilation_createForDevices(m, devices, 2, &c));
    int rc = ANeuralNetworksCompilation_finish(c);
    ANeuralNetworksCompilation_free(c);
    return rc;
}

static const uint32_t kOne[1] = {1}, kTen[1] = {10};
static const bool kTrue[3] = {true, true, true}, kFalse[1] = {false};
#define EXT(code) (-(code) - 1) /* an extension operand type, by its code */

int main(void) {
    if (find_devices()) {
        printf("FAIL devices\n");
        return 1;
    }
    ANeuralNetworksModel* m;

    /* INT64 in, TENSOR_QUANT64_ASYMM {0.5, 10} out */
    Quant64Params q = {0.5, 10};
    if (build(&m, EXT(EXAMPLE_INT64), 0, NULL, EXT(EXAMPLE_TENSOR_QUANT64_ASYMM), 1, kTen, false,
              &q, EXAMPLE_FIBONACCI)) return 1;
    expect_supported(m, devices, 2, kTrue, 1);
    int64_t n = 10, out64[10] = {0};
    EXPECT(run(m, &n, sizeof n, out64, sizeof out64), ANEURALNETWORKS_NO_ERROR);
    for (int i = 0; i < 10; i++) EXPECT(out64[i], kFib[i] / 0.5 + 10);
    ANeuralNetworksModel_free(m);
    printf("ok extension operand types\n");

    /* float in and out, ADD around: temporaries cross devices */
    if (build(&m, ANEURALNETWORKS_TENSOR_FLOAT32, 1, kOne, ANEURALNETWORKS_TENSOR_FLOAT32, 1,
              kTen, true, NULL, EXAMPLE_FIBONACCI)) return 1;
    expect_supported(m, devices, 2, kTrue, 3);
    float nf = 10, outf[10] = {0};
    EXPECT(run(m, &nf, sizeof nf, outf, sizeof outf), ANEURALNETWORKS_NO_ERROR);
    for (int i = 0; i < 10; i++) EXPECT(outf[i], kFib[i]);
    ANeuralNetworksModel_free(m);
    printf("ok temporaries\n");

    /* a negative n fails the execution */
    if (build(&m, ANEURALNETWORKS_TENSOR_FLOAT32, 1, kOne, ANEURALNETWORKS_TENSOR_FLOAT32, 1,
              kOne, false, NULL, EXAMPLE_FIBONACCI)) return 1;
    expect_supported(m, devices, 2, kTrue, 1);
    for (uint32_t i = 0; i < count; i++) {
        bool want = every[i] == devices[0];
        expect_supported(m, &every[i], 1, &want, 1); /* only the Fibonacci device */
    }
    float neg = -1, one[1];
    EXPECT(run(m, &neg, sizeof neg, one, sizeof one), ANEURALNETWORKS_OP_FAILED);
    ANeuralNetworksModel_free(m);
    printf("ok negative n\n");

    /* unsupported input type, output type, operation code: nobody, BAD_DATA at finish */
    struct { int32_t in, out, code; const char* what; } bad[3] = {
        {ANEURALNETWORKS_TENSOR_INT32, ANEURALNETWORKS_TENSOR_FLOAT32, 0, "input type"},
        {ANEURALNETWORKS_TENSOR_FLOAT32, ANEURALNETWORKS_TENSOR_INT32, 0, "output type"},
        {ANEURALNETWORKS_TENSOR_FLOAT32, ANEURALNETWORKS_TENSOR_FLOAT32, 1, "operation"}};
    for (int k = 0; k < 3; k++) {
        if (build(&m, bad[k].in, 1, kOne, bad[k].out, 1, kOne, false, NULL, bad[k].code))
            return 1;
        expect_supported(m, devices, 2, kFalse, 1);
        EXPECT(finish_fails(m), ANEURALNETWORKS_BAD_DATA);
        ANeuralNetworksModel_free(m);
        printf("ok invalid %s\n", bad[k].what);
    }

    /* two inputs, two outputs */
    for (int outs = 1; outs <= 2; outs++) {
        n_operands = 0;
        CHECK(ANeuralNetworksModel_create(&m));
        uint32_t a = operand(m, ANEURALNETWORKS_TENSOR_FLOAT32, 1, kOne);
        uint32_t b = operand(m, ANEURALNETWORKS_TENSOR_FLOAT32, 1, kOne);
        uint32_t c = operand(m, ANEURALNETWORKS_TENSOR_FLOAT32, 1, kOne);
        ANeuralNetworksOperationType fib;
        CHECK(ANeuralNetworksModel_getExtensionOperationType(m, kName, EXAMPLE_FIBONACCI, &fib));
        uint32_t ins[2] = {a, b}, o[2] = {b, c};
        uint32_t n_in = outs == 1 ? 2 : 1;
        uint32_t* out_list = outs == 1 ? &c : o;
        CHECK(ANeuralNetworksModel_addOperation(m, fib, n_in, ins, outs, out_list));
        CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(m, n_in, ins, outs, out_list));
        CHECK(ANeuralNetworksModel_finish(m));
        expect_supported(m, devices, 2, kFalse, 1);
        EXPECT(finish_fails(m), ANEURALNETWORKS_BAD_DATA);
        ANeuralNetworksModel_free(m);
        printf("ok invalid %s\n", outs == 1 ? "input count" : "output count");
    }

    /* an extension no device supports, a scalar extension type with dimensions */
    int32_t t;
    CHECK(ANeuralNetworksModel_create(&m));
    EXPECT(ANeuralNetworksModel_getExtensionOperandType(m, "com.example.unknown", 0, &t),
           ANEURALNETWORKS_BAD_DATA);
    CHECK(ANeuralNetworksModel_getExtensionOperandType(m, kName, EXAMPLE_INT64, &t));
    ANeuralNetworksOperandType scalar_with_dims = {t, 1, kOne, 0.f, 0};
    EXPECT(ANeuralNetworksModel_addOperand(m, &scalar_with_dims), ANEURALNETWORKS_BAD_DATA);
    ANeuralNetworksModel_free(m);
    printf("ok: %d failures\n", failures);
    return failures != 0;
}
