/* Calls made when the library cannot start Python: each returns a code, nothing crashes. */
#include "common.h"

int main(void) {
    ANeuralNetworksModel* model = NULL;
    printf("create %d\n", ANeuralNetworksModel_create(&model));
    printf("finish %d\n", ANeuralNetworksModel_finish(model));
    ANeuralNetworksModel_free(model);
    return 0;
}
