/* The NDK's struct layouts and a few of its values, checked by the compiler at build time. */
#include <stddef.h>

#include "NeuralNetworks.h"

#define ASSERT(x) _Static_assert(x, #x)
ASSERT(sizeof(ANeuralNetworksOperandType) == (sizeof(void*) == 8 ? 24 : 20));
ASSERT(sizeof(ANeuralNetworksSymmPerChannelQuantParams) == 8 + sizeof(void*));
ASSERT(offsetof(ANeuralNetworksOperandType, type) == 0);
ASSERT(offsetof(ANeuralNetworksOperandType, dimensionCount) == 4);
ASSERT(offsetof(ANeuralNetworksOperandType, dimensions) == 8);
ASSERT(offsetof(ANeuralNetworksOperandType, scale) == 8 + sizeof(void*));
ASSERT(offsetof(ANeuralNetworksOperandType, zeroPoint) == 12 + sizeof(void*));
ASSERT(offsetof(ANeuralNetworksSymmPerChannelQuantParams, channelDim) == 0);
ASSERT(offsetof(ANeuralNetworksSymmPerChannelQuantParams, scaleCount) == 4);
ASSERT(offsetof(ANeuralNetworksSymmPerChannelQuantParams, scales) == 8);
ASSERT(ANEURALNETWORKS_MODEL == 15 && ANEURALNETWORKS_TENSOR_QUANT8_ASYMM_SIGNED == 14);
ASSERT(ANEURALNETWORKS_ADD == 0 && ANEURALNETWORKS_RANK == 101 && ANEURALNETWORKS_WHILE == 97);
ASSERT(ANEURALNETWORKS_PRIORITY_DEFAULT == 100 && ANEURALNETWORKS_DEAD_OBJECT == 14);
ASSERT(ANEURALNETWORKS_FEATURE_LEVEL_5 == 31 && ANEURALNETWORKS_PADDING_VALID == 2);
ASSERT(ANEURALNETWORKS_FENCED_DURATION_IN_DRIVER == 3 && ANEURALNETWORKS_DEVICE_ACCELERATOR == 4);
ASSERT(ANEURALNETWORKS_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES == 128);
ASSERT(ANEURALNETWORKS_BYTE_SIZE_OF_CACHE_TOKEN == 32);

int main(void) { return 0; }
