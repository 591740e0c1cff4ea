/* libshoal from C against real servers: micro-checkpointing (docs/checkpoint.md). Four
 * tasks (threads, each with its rank as part number) save parts of checkpoints 0 and 1 in
 * any order with no barrier; checkpoint 2 misses a part, so it stays uncommitted and a
 * restart (a second handle) finds 1 as the latest and loads its parts; the missing part
 * then commits 2. Errors too. Run by c_api.rs with the cluster's configuration as argv[1];
 * prints "ok" and exits 0, or names the failed check. */
#include <shoal.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#define PARTS 4

struct task {
    shoal_checkpoint *k;
    uint32_t rank;
};

/* One task: its part of checkpoints 0 and 1, and of 2 unless it is the last rank. */
static void *run(void *arg) {
    struct task *t = arg;
    char data[64];
    for (uint64_t n = 0; n < 3; n++) {
        if (n == 2 && t->rank == PARTS - 1) {
            break; /* killed before it saves its part of 2 */
        }
        int len = snprintf(data, sizeof data, "step %llu part %u", (unsigned long long)n, t->rank);
        CHECK(shoal_checkpoint_save(t->k, n, t->rank, data, (size_t)len) == 0);
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    shoal_checkpoint *k = shoal_checkpoint_open(c, "csim", "/cckpt/sim", PARTS);
    CHECK(k != NULL);
    uint64_t latest = 77;
    CHECK(shoal_checkpoint_latest(k, &latest) == 0 && latest == 77);
    CHECK(shoal_checkpoint_is_committed(k, 0, 0) == 0);

    /* One part of 0 is not enough. */
    CHECK(shoal_checkpoint_save(k, 0, 2, "early", 5) == 0);
    CHECK(shoal_checkpoint_is_committed(k, 0, 100) == 0);

    /* Every task on its own thread, no barrier. */
    pthread_t th[PARTS];
    struct task tasks[PARTS];
    for (uint32_t r = 0; r < PARTS; r++) {
        tasks[r] = (struct task){k, r};
        CHECK(pthread_create(&th[r], NULL, run, &tasks[r]) == 0);
    }
    for (uint32_t r = 0; r < PARTS; r++) {
        CHECK(pthread_join(th[r], NULL) == 0);
    }
    CHECK(shoal_checkpoint_is_committed(k, 0, 0) == 1);
    CHECK(shoal_checkpoint_is_committed(k, 1, SHOAL_WAIT_FOREVER) == 1);
    CHECK(shoal_checkpoint_is_committed(k, 2, 200) == 0);
    CHECK(shoal_checkpoint_latest(k, &latest) == 1 && latest == 1);
    CHECK(shoal_checkpoint_free(k) == 0);

    /* Restart: a new handle finds 1, and loads every part of it (the length first). */
    k = shoal_checkpoint_open(c, "csim", "/cckpt/sim", PARTS);
    CHECK(k != NULL);
    CHECK(shoal_checkpoint_latest(k, &latest) == 1 && latest == 1);
    char buf[64], want[64];
    for (uint32_t r = 0; r < PARTS; r++) {
        int len = snprintf(want, sizeof want, "step 1 part %u", r);
        CHECK(shoal_checkpoint_load(k, 1, r, NULL, 0) == len);
        memset(buf, 0, sizeof buf);
        CHECK(shoal_checkpoint_load(k, 1, r, buf, sizeof buf) == len && memcmp(buf, want, (size_t)len) == 0);
    }
    /* The part saved twice holds the later bytes. */
    CHECK(shoal_checkpoint_load(k, 0, 2, buf, sizeof buf) == 13 && memcmp(buf, "step 0 part 2", 13) == 0);
    /* A buffer too small: ERANGE, nothing copied. */
    memset(buf, 'x', sizeof buf);
    CHECK(shoal_checkpoint_load(k, 1, 0, buf, 3) == -1 && errno == ERANGE && buf[0] == 'x');
    /* A part never saved. */
    CHECK(shoal_checkpoint_load(k, 2, PARTS - 1, buf, sizeof buf) == -1 && errno == ENOENT);

    /* The missing task comes back and saves its part of 2: 2 is committed. */
    CHECK(shoal_checkpoint_save(k, 2, PARTS - 1, "late", 4) == 0);
    CHECK(shoal_checkpoint_is_committed(k, 2, 0) == 1);
    CHECK(shoal_checkpoint_latest(k, &latest) == 1 && latest == 2);
    /* An empty part is a part. */
    CHECK(shoal_checkpoint_save(k, 3, 0, NULL, 0) == 0 && shoal_checkpoint_load(k, 3, 0, NULL, 0) == 0);

    /* Errors: no such part, no parts, an empty name, NULLs, a bad timeout. */
    CHECK(shoal_checkpoint_save(k, 4, PARTS, "x", 1) == -1 && errno == EINVAL && strstr(shoal_last_error(), "part"));
    CHECK(shoal_checkpoint_open(c, "csim", "/cckpt/sim", 0) == NULL && errno == EINVAL);
    CHECK(shoal_checkpoint_open(c, "", "/cckpt/sim", 2) == NULL && errno == EINVAL);
    CHECK(shoal_checkpoint_open(c, NULL, "/cckpt/sim", 2) == NULL && errno == EFAULT);
    CHECK(shoal_checkpoint_save(k, 4, 0, NULL, 1) == -1 && errno == EFAULT);
    CHECK(shoal_checkpoint_save(NULL, 4, 0, "x", 1) == -1 && errno == EFAULT);
    CHECK(shoal_checkpoint_latest(k, NULL) == -1 && errno == EFAULT);
    CHECK(shoal_checkpoint_is_committed(k, 0, -7) == -1 && errno == EINVAL);
    CHECK(shoal_checkpoint_free(k) == 0 && shoal_checkpoint_free(NULL) == 0);

    shoal_disconnect(c);
    printf("ok\n");
    return 0;
}
