/* createFromSyncFenceFd with descriptors that are not sync fences, and an eventfd fence that
 * never signals: freeing its event returns at once. */
#include <fcntl.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

int main(void) {
    int p[2];
    if (pipe(p) != 0)
        return 1;
    ANeuralNetworksEvent* ev = NULL;
    EXPECT(ANeuralNetworksEvent_createFromSyncFenceFd(p[0], &ev), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ev == NULL, 1);
    int file = open("/proc/self/cmdline", O_RDONLY);
    EXPECT(ANeuralNetworksEvent_createFromSyncFenceFd(file, &ev), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksEvent_createFromSyncFenceFd(0, &ev), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksEvent_createFromSyncFenceFd(-5, &ev), ANEURALNETWORKS_BAD_DATA);
    EXPECT(ANeuralNetworksEvent_createFromSyncFenceFd(9999, &ev), ANEURALNETWORKS_BAD_DATA);
    int never = eventfd(0, EFD_CLOEXEC);
    EXPECT(ANeuralNetworksEvent_createFromSyncFenceFd(never, &ev), ANEURALNETWORKS_NO_ERROR);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ANeuralNetworksEvent_free(ev);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double took = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    EXPECT(took < 2.0, 1);
    printf("ok: %d failures, free took %.3f s\n", failures, took);
    return failures != 0;
}
