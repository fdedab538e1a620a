/* Invalid arguments from C: NULL handles and pointers, freed and foreign handles, handles of
 * the wrong kind, wrong lengths; each call returns its code and the process lives. */
#include <stdint.h>

#include "common.h"

int main(void) {
    ANeuralNetworksModel* model;
    ANeuralNetworksCompilation* comp;
    ANeuralNetworksExecution* ex;
    if (float_add_compilation(&model, &comp))
        return 1;
    const float a[4] = {1, 2, 3, 4};
    float c[4];
    int foreign_storage[16] = {0};
    void* foreign = foreign_storage;

    /* NULL */
    EXPECT(ANeuralNetworksModel_create(NULL), ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksModel_addOperand(NULL, NULL), ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksCompilation_create(NULL, &comp), ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksCompilation_create(model, NULL), ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksExecution_create(NULL, &ex), ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksExecution_compute(NULL), ANEURALNETWORKS_UNEXPECTED_NULL);
    EXPECT(ANeuralNetworksEvent_wait(NULL), ANEURALNETWORKS_UNEXPECTED_NULL);
    ANeuralNetworksModel_free(NULL);
    ANeuralNetworksExecution_free(NULL);

    /* foreign pointers and handles of another kind */
    EXPECT(ANeuralNetworksModel_finish((ANeuralNetworksModel*)foreign), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_compute((ANeuralNetworksExecution*)foreign),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_create((ANeuralNetworksCompilation*)model, &ex),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksCompilation_finish((ANeuralNetworksCompilation*)model),
           ANEURALNETWORKS_BAD_DATA);
    ANeuralNetworksModel_free((ANeuralNetworksModel*)foreign);        /* ignored */
    ANeuralNetworksCompilation_free((ANeuralNetworksCompilation*)model); /* wrong kind: ignored */
    ANeuralNetworksCompilation* comp2 = NULL;  /* the model lived through both */
    EXPECT(ANeuralNetworksCompilation_create(model, &comp2), ANEURALNETWORKS_NO_ERROR);
    ANeuralNetworksCompilation_free(comp2);

    /* lengths */
    CHECK(ANeuralNetworksExecution_create(comp, &ex));
    EXPECT(ANeuralNetworksExecution_setInput(ex, 0, NULL, a, sizeof a - 1),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_setInput(ex, 0, NULL, NULL, sizeof a),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_setOutput(ex, 0, NULL, c, sizeof c + 4),
           ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_setInput(ex, 5, NULL, a, sizeof a), ANEURALNETWORKS_BAD_DATA);
    uint32_t rank = 0;
    EXPECT(ANeuralNetworksExecution_getOutputOperandRank(ex, 0, &rank), ANEURALNETWORKS_BAD_STATE);
    EXPECT(ANeuralNetworksExecution_getOutputOperandRank(ex, 0, NULL),
           ANEURALNETWORKS_UNEXPECTED_NULL);
    int32_t value = 0;
    EXPECT(ANeuralNetworksModel_setOperandValue(model, 2, &value, sizeof value),
           ANEURALNETWORKS_BAD_STATE); /* finished */
    ANeuralNetworksOperandType bad = {ANEURALNETWORKS_TENSOR_FLOAT32, 2, NULL, 0.f, 0};
    ANeuralNetworksModel* m2;
    CHECK(ANeuralNetworksModel_create(&m2));
    EXPECT(ANeuralNetworksModel_addOperand(m2, &bad), ANEURALNETWORKS_BAD_DATA);
    ANeuralNetworksOperandType f = {ANEURALNETWORKS_FLOAT32, 0, NULL, 0.f, 0};
    CHECK(ANeuralNetworksModel_addOperand(m2, &f));
    EXPECT(ANeuralNetworksModel_setOperandValue(m2, 0, &value, 3), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksModel_setOperandValue(m2, 0, NULL, 4), ANEURALNETWORKS_BAD_DATA);
    ANeuralNetworksModel_free(m2);

    /* freed handles */
    ANeuralNetworksExecution_free(ex);
    EXPECT(ANeuralNetworksExecution_compute(ex), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksExecution_setInput(ex, 0, NULL, a, sizeof a), ANEURALNETWORKS_BAD_DATA);
    ANeuralNetworksExecution_free(ex);  /* twice: ignored */
    ANeuralNetworksCompilation_free(comp);
    EXPECT(ANeuralNetworksExecution_create(comp, &ex), ANEURALNETWORKS_BAD_DATA);
    ANeuralNetworksModel_free(model);
    EXPECT(ANeuralNetworksModel_finish(model), ANEURALNETWORKS_BAD_DATA);
    printf("%s: %d failures\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
