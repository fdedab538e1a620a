/* Fill a range of fresh anonymous memory with a file's bytes on a thread of its own, while
 * other threads already read the range: a page touched before its turn is filled at once
 * (the toucher waits for it, and only for it) instead of reading as zeros.
 *
 * Why: on the machines nnhal is measured on, reading a 14 MB model into fresh memory costs
 * 8-10 ms of page faults, on the way of every open, and the open's Python (verification, the
 * table walk, the conversion) needs only a few of those pages. The kernel's userfaultfd makes
 * the memory wait for its bytes: copying it in with UFFDIO_COPY costs less than the faults
 * (no zeroing, no fault per page), and the open goes on meanwhile.
 *
 * Compiled at first use by nnhal/memory/fill.py and called through ctypes (which releases
 * the GIL around each call: the thread here never takes it, so a Python thread waiting for a
 * page, GIL held, is served all the same). Linux only; every failure to start is reported
 * (errno) for the caller to read the file the plain way instead.
 *
 * Guarantees: every page of the range ends filled, with the file's bytes or, past a short
 * read or an I/O error, zeros (so no toucher waits for ever), and the error is reported; the
 * range is unregistered before the fill counts as done.
 *
 * A reader that knows which pages it is about to read (the verifier: a table per weight
 * buffer, spread over the whole file) asks for them all in one call (nnhal_fill_want), which
 * copies them in from the calling thread: a fault is a round trip through the fill's thread
 * (25 us each measured here, 3 ms for MobileNetV2's 136 tables), a page copied here costs a
 * read and an ioctl.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

enum {
    BLOCK = 64 * 1024,   /* what one toucher's fault fills: a few reads of the file's tables */
    CHUNK = 64 * 1024,   /* what one step of the in-order fill copies (faults wait for one) */
};

typedef struct nnhal_fill {
    int uffd, fd;
    char *dst;
    size_t len;
    long long off;        /* the file offset of dst[0] */
    long long end;        /* where the file must end (-1: anywhere) */
    size_t nblocks;
    unsigned char *filled;
    char *tmp;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;             /* under lock */
    int error;            /* errno of the first failure: EIO and the like, ENODATA for a file
                             shorter than it was, ESTALE for one longer */
    long long got;        /* bytes read from the file */
    int served;           /* faults served out of order (a figure for tests) */
} nnhal_fill;

static int read_fully(int fd, char *buf, size_t n, long long off, int *error) {
    size_t at = 0;
    while (at < n) {
        ssize_t r = pread(fd, buf + at, n - at, (off_t)(off + (long long)at));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (!*error)
                *error = r < 0 ? errno : ENODATA;
            memset(buf + at, 0, n - at);
            return (int)at;
        }
        at += (size_t)r;
    }
    return (int)at;
}

/* Copy tmp into dst[start, start + n). A page found already there is one a waiter's fault
 * was served with (the same bytes): skipped. A copy across two of the kernel's mappings
 * (memory the allocator grew in steps: ENOENT) goes on a page at a time. Nothing but
 * EAGAIN (the mm changing under the copy) is retried. Returns 0, or an errno the fill
 * cannot go past. */
static int place(nnhal_fill *f, size_t start, size_t n) {
    size_t at = 0, step = n;
    while (at < n) {
        size_t len = n - at < step ? n - at : step;
        struct uffdio_copy c = {.dst = (uintptr_t)(f->dst + start + at),
                                .src = (uintptr_t)(f->tmp + at),
                                .len = len, .mode = 0};
        if (ioctl(f->uffd, UFFDIO_COPY, &c) == 0) {
            at += (size_t)c.copy;
            continue;
        }
        if (c.copy > 0)
            at += (size_t)c.copy;
        if (errno == EEXIST)
            at = (at + 4096) & ~(size_t)4095;  /* the page at `at` is there: past it */
        else if (errno == ENOENT && step > 4096)
            step = 4096;
        else if (errno != EAGAIN && errno != EINTR)
            return errno;
    }
    return 0;
}

static int fill_blocks(nnhal_fill *f, size_t a, size_t b) {
    size_t start = a * BLOCK, end = b * BLOCK < f->len ? b * BLOCK : f->len;
    f->got += read_fully(f->fd, f->tmp, end - start, f->off + (long long)start, &f->error);
    int e = place(f, start, end - start);
    for (size_t k = a; k < b; k++)
        f->filled[k] = 1;
    return e;
}

/* Serve the faults waiting now; returns an errno the fill cannot go past, else 0. */
static int serve_faults(nnhal_fill *f) {
    struct uffd_msg msgs[16];
    for (;;) {
        ssize_t r = read(f->uffd, msgs, sizeof msgs);
        if (r < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : errno;
        for (size_t i = 0; i < (size_t)r / sizeof msgs[0]; i++) {
            if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
                continue;
            uintptr_t addr = (uintptr_t)msgs[i].arg.pagefault.address;
            if (addr < (uintptr_t)f->dst || addr >= (uintptr_t)f->dst + f->len)
                continue;
            size_t k = (addr - (uintptr_t)f->dst) / BLOCK;
            if (!f->filled[k]) {
                int e = fill_blocks(f, k, k + 1);
                f->served++;
                if (e)
                    return e;
            } else {  /* filled while the fault was on its way: wake its waiter */
                struct uffdio_range w = {.start = addr & ~(uintptr_t)4095, .len = 4096};
                ioctl(f->uffd, UFFDIO_WAKE, &w);
            }
        }
    }
}

static void *run(void *arg) {
    nnhal_fill *f = arg;
    int fatal = 0;
    size_t next = 0;
    while (!fatal) {
        fatal = serve_faults(f);
        while (next < f->nblocks && f->filled[next])
            next++;
        if (fatal || next >= f->nblocks)
            break;
        size_t b = next;
        while (b < f->nblocks && b - next < CHUNK / BLOCK && !f->filled[b])
            b++;
        fatal = fill_blocks(f, next, b);
    }
    if (fatal && !f->error)
        f->error = fatal;
    char byte;
    if (!f->error && f->end >= 0 && pread(f->fd, &byte, 1, (off_t)f->end) > 0)
        f->error = ESTALE;  /* the file grew while it was read */
    /* Unregistering wakes every waiter left; a page never copied (only after a fatal ioctl
     * error) is then an ordinary fresh page, and the error says the bytes are not the file's.
     * Under the lock: nnhal_fill_want uses both descriptors while the fill is not done. */
    pthread_mutex_lock(&f->lock);
    struct uffdio_range all = {.start = (uintptr_t)f->dst, .len = f->len};
    ioctl(f->uffd, UFFDIO_UNREGISTER, &all);
    close(f->uffd);
    close(f->fd);
    f->uffd = f->fd = -1;
    f->done = 1;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

static int open_uffd(void) {
    int u = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (u < 0 && errno == EPERM)  /* unprivileged: faults taken in user mode only */
        u = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    return u;
}

/* Start filling dst[0, len) (page-aligned, the caller's, whatever it holds dropped) with the file's bytes from `off`;
 * `end` is where the file must end (checked once filled; -1: not checked). The descriptor is
 * duplicated (the caller may close its own). NULL and errno on failure, with nothing
 * registered: the caller reads the plain way. */
nnhal_fill *nnhal_fill_start(int fd, long long off, void *dst, size_t len, long long end) {
    long page = sysconf(_SC_PAGESIZE);
    if (page != 4096 || len == 0 || ((uintptr_t)dst | len) % 4096) {
        errno = EINVAL;
        return NULL;
    }
    /* Every page must be missing for the kernel to ask for it: the allocator may have handed
     * out memory used before (zeroed, so resident). It is the caller's and about to be
     * overwritten: dropped, it is missing again. */
    if (madvise(dst, len, MADV_DONTNEED))
        return NULL;
    nnhal_fill *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->uffd = f->fd = -1;
    f->dst = dst;
    f->len = len;
    f->off = off;
    f->end = end;
    f->nblocks = (len + BLOCK - 1) / BLOCK;
    f->filled = calloc(f->nblocks, 1);
    f->tmp = malloc(CHUNK);
    int e = 0;
    if (!f->filled || !f->tmp)
        e = ENOMEM;
    if (!e && (f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
        e = errno;
    if (!e && (f->uffd = open_uffd()) < 0)
        e = errno;
    if (!e) {
        struct uffdio_api api = {.api = UFFD_API, .features = 0};
        if (ioctl(f->uffd, UFFDIO_API, &api))
            e = errno;
    }
    if (!e) {
        struct uffdio_register reg = {.range = {.start = (uintptr_t)dst, .len = len},
                                      .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (ioctl(f->uffd, UFFDIO_REGISTER, &reg))
            e = errno;
        else if (!(reg.ioctls & ((uint64_t)1 << _UFFDIO_COPY)))
            e = ENOTSUP;
        if (e == ENOTSUP) {
            struct uffdio_range all = {.start = (uintptr_t)dst, .len = len};
            ioctl(f->uffd, UFFDIO_UNREGISTER, &all);
        }
    }
    pthread_condattr_t ca;
    if (!e) {
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_mutex_init(&f->lock, NULL);
        pthread_cond_init(&f->cond, &ca);
        pthread_condattr_destroy(&ca);
        e = pthread_create(&f->thread, NULL, run, f);
        if (e) {
            struct uffdio_range all = {.start = (uintptr_t)dst, .len = len};
            ioctl(f->uffd, UFFDIO_UNREGISTER, &all);
            pthread_cond_destroy(&f->cond);
            pthread_mutex_destroy(&f->lock);
        }
    }
    if (e) {
        if (f->uffd >= 0)
            close(f->uffd);
        if (f->fd >= 0)
            close(f->fd);
        free(f->filled);
        free(f->tmp);
        free(f);
        errno = e;
        return NULL;
    }
    return f;
}

/* Copy in, from this thread, the page holding each of the `n` byte offsets (into dst) that
 * the fill has not reached yet: pages about to be read, in one call instead of a fault each.
 * A page the fill (or a fault) placed meanwhile is left as it is (EEXIST); a page that cannot
 * be read or placed here is left to the fill, which reports what it finds. Nothing once the
 * fill is done. The caller must not free the fill during the call. */
void nnhal_fill_want(nnhal_fill *f, const long long *offsets, size_t n) {
    char page[4096];
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < n && !f->done; i++) {
        if (offsets[i] < 0 || (unsigned long long)offsets[i] >= f->len)
            continue;
        size_t at = (size_t)offsets[i] & ~(size_t)4095;
        if (f->filled[at / BLOCK])  /* (read unlocked by the fill: a stale 0 costs a copy) */
            continue;
        ssize_t r = pread(f->fd, page, sizeof page, (off_t)(f->off + (long long)at));
        if (r != (ssize_t)sizeof page)
            continue;  /* the file's end or an error: the fill's to report */
        struct uffdio_copy c = {.dst = (uintptr_t)f->dst + at, .src = (uintptr_t)page,
                                .len = sizeof page, .mode = 0};
        ioctl(f->uffd, UFFDIO_COPY, &c);  /* EEXIST: there already */
    }
    pthread_mutex_unlock(&f->lock);
}

/* 1 once the fill is done (every page filled, the range unregistered), 0 when `timeout_ms`
 * passed first. */
int nnhal_fill_wait(nnhal_fill *f, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&f->lock);
    int r = 0;
    while (!f->done && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&f->cond, &f->lock, &until);
    int done = f->done;
    pthread_mutex_unlock(&f->lock);
    return done;
}

/* Once done: the errno of the first failure (0: every byte is the file's); `got` and
 * `served` as counted. */
int nnhal_fill_result(nnhal_fill *f, long long *got, int *served) {
    *got = f->got;
    *served = f->served;
    return f->error;
}

/* Release a fill that is done (joins its thread). -1 (EBUSY) while it is not. */
int nnhal_fill_free(nnhal_fill *f) {
    pthread_mutex_lock(&f->lock);
    int done = f->done;
    pthread_mutex_unlock(&f->lock);
    if (!done) {
        errno = EBUSY;
        return -1;
    }
    pthread_join(f->thread, NULL);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    free(f->filled);
    free(f->tmp);
    free(f);
    return 0;
}
