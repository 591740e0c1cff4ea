/* libshoal from C against real servers: blocking calls, futures (wait, test, wait_any,
 * wait_all, cancel, callbacks), and errors as errno plus a message. Run by c_api.rs with
 * the cluster's configuration as argv[1]; prints "ok" and exits 0, or names the failed check. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "check.h"

enum { BLOCK = 64 * 1024, BLOCKS = 32 };

static atomic_long called;
static atomic_long called_bytes;

static void on_done(int64_t result, void *user) {
    atomic_fetch_add(&called, 1);
    if (result > 0) atomic_fetch_add(&called_bytes, result);
    *(int64_t *)user = result;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 31 + i * 7);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);

    /* Errors: errno and a message naming the cause. */
    shoal_attr a;
    CHECK(shoal_stat(c, "/no/such/file", &a) == -1 && errno == ENOENT);
    CHECK(strlen(shoal_last_error()) > 0);
    CHECK(shoal_connect("/nonexistent/cluster.toml") == NULL && strlen(shoal_last_error()) > 0);
    CHECK(shoal_stat(NULL, "/", &a) == -1 && errno == EFAULT);
    CHECK(shoal_open(c, "/x", O_RDWR | O_WRONLY | O_RDONLY | 3, 0644) == NULL && errno == EINVAL);

    /* Blocking calls. */
    CHECK(shoal_mkdir(c, "/c", 0755) == 0);
    CHECK(shoal_mkdir(c, "/c", 0755) == -1 && errno == EEXIST);
    CHECK(shoal_stat(c, "/c", &a) == 0 && S_ISDIR(a.mode) && (a.mode & 0777) == 0755);
    shoal_file *f = shoal_open(c, "/c/data", O_CREAT | O_RDWR | O_EXCL, 0640);
    CHECK(f != NULL);
    CHECK(shoal_open(c, "/c/data", O_CREAT | O_RDWR | O_EXCL, 0640) == NULL && errno == EEXIST);
    unsigned char *out = malloc(BLOCK * BLOCKS), *in = malloc(BLOCK * BLOCKS);
    fill(out, BLOCK * BLOCKS, 1);
    CHECK(shoal_pwrite(f, out, BLOCK, 0) == BLOCK);
    CHECK(shoal_fsync(f) == 0);
    CHECK(shoal_pread(f, in, BLOCK, 0) == BLOCK && memcmp(in, out, BLOCK) == 0);
    CHECK(shoal_pread(f, in, BLOCK, 10 * BLOCK) == 0); /* past the end */

    /* Futures: many writes in flight, each completing with a callback. */
    shoal_future *futs[BLOCKS];
    int64_t results[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        results[i] = -1;
        futs[i] = shoal_pwrite_async(f, out + (size_t)i * BLOCK, BLOCK, (uint64_t)i * BLOCK, on_done, &results[i]);
        CHECK(futs[i] != NULL);
    }
    CHECK(shoal_future_wait_all((const shoal_future *const *)futs, BLOCKS) == 0);
    for (int i = 0; i < BLOCKS; i++) {
        int64_t r = 0;
        CHECK(shoal_future_test(futs[i], &r) == 1 && r == BLOCK);
        shoal_future_free(futs[i]);
    }
    /* Callbacks ran on a runtime thread, once each (they may trail the wait by a moment). */
    for (int spins = 0; atomic_load(&called) < BLOCKS && spins < 1000; spins++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(atomic_load(&called) == BLOCKS && atomic_load(&called_bytes) == (long)BLOCK * BLOCKS);
    for (int i = 0; i < BLOCKS; i++) CHECK(results[i] == BLOCK);

    /* Asynchronous reads, waited for one at a time with wait_any. */
    memset(in, 0, BLOCK * BLOCKS);
    for (int i = 0; i < BLOCKS; i++) {
        futs[i] = shoal_pread_async(f, in + (size_t)i * BLOCK, BLOCK, (uint64_t)i * BLOCK, NULL, NULL);
        CHECK(futs[i] != NULL);
    }
    int left = BLOCKS;
    while (left > 0) {
        size_t at = 0;
        CHECK(shoal_future_wait_any((const shoal_future *const *)futs, (size_t)left, &at) == 0);
        int64_t r = 0;
        CHECK(shoal_future_wait(futs[at], &r) == 0 && r == BLOCK);
        shoal_future_free(futs[at]);
        futs[at] = futs[left - 1];
        left--;
    }
    CHECK(memcmp(in, out, BLOCK * BLOCKS) == 0);

    /* Cancel: either it had completed (0) or its result is -ECANCELED (1). */
    shoal_future *fut = shoal_pread_async(f, in, BLOCK, 0, NULL, NULL);
    CHECK(fut != NULL);
    int cancelled = shoal_future_cancel(fut);
    int64_t r = 0;
    CHECK(shoal_future_wait(fut, &r) == 0);
    CHECK(cancelled == 1 ? r == -ECANCELED : (cancelled == 0 && r == BLOCK));
    shoal_future_free(fut);

    /* An asynchronous call that fails reports -errno. */
    shoal_file *ro = shoal_open(c, "/c/data", O_RDONLY, 0);
    CHECK(ro != NULL);
    fut = shoal_pwrite_async(ro, out, 16, 0, NULL, NULL);
    CHECK(fut != NULL);
    CHECK(shoal_future_wait(fut, &r) == 0 && r < 0);
    shoal_future_free(fut);
    shoal_close(ro);

    /* Close with a future still holding the file: EBUSY, then fine once it is done. */
    fut = shoal_fsync_async(f, NULL, NULL);
    CHECK(fut != NULL);
    int busy = shoal_close(f);
    if (busy == -1) {
        CHECK(errno == EBUSY);
        CHECK(shoal_future_wait(fut, &r) == 0 && r == 0);
        shoal_future_free(fut);
        CHECK(shoal_close(f) == 0);
    } else {
        /* The fsync had finished and released the file before close looked. */
        shoal_future_free(fut);
    }
    CHECK(shoal_stat(c, "/c/data", &a) == 0 && a.size == (uint64_t)BLOCK * BLOCKS);
    CHECK(shoal_rename(c, "/c/data", "/c/renamed") == 0);
    CHECK(shoal_unlink(c, "/c/renamed") == 0);
    CHECK(shoal_rmdir(c, "/c") == 0);
    CHECK(shoal_stat(c, "/c", &a) == -1 && errno == ENOENT);
    shoal_disconnect(c);
    free(in);
    free(out);
    puts("ok");
    return 0;
}
