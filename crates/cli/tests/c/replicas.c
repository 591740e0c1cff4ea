/* libshoal's replica counts from C against real servers (3 of them, `[cluster] replicas =
 * 2`): a directory's default count is kept as set and inherited by new files, a file may
 * ask for its own, more than the cluster keeps is capped, and a count outside 0 to
 * SHOAL_REPLICAS_MAX (or a non-zero reserved field) is EINVAL at the call. Run by
 * replicas_layout.rs with the cluster's configuration as argv[1]. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#define SERVERS 3

/* The replica count `shoal_get_layout` reports for `path`. */
static uint32_t replicas_of(shoal_client *c, const char *path) {
    shoal_layout l;
    uint32_t servers[SERVERS];
    CHECK(shoal_get_layout(c, path, &l, servers, SERVERS) >= 0);
    CHECK(l.reserved == 0);
    return l.replicas;
}

/* Create `path` with `layout` (NULL: the directory's default) and close it. */
static void make(shoal_client *c, const char *path, const shoal_layout *layout) {
    shoal_file *f = shoal_create(c, path, O_WRONLY | O_EXCL, 0644, layout);
    CHECK(f != NULL && shoal_close(f) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    CHECK(SHOAL_REPLICAS_MAX == 3);
    CHECK(shoal_mkdir(c, "/r", 0755) == 0);

    /* Nothing set: a directory reports 0 (inherit), a file the cluster's count. */
    CHECK(replicas_of(c, "/r") == 0);
    make(c, "/r/plain", NULL);
    CHECK(replicas_of(c, "/r/plain") == 2);

    /* A directory's default of 1: kept as set, inherited by files and by mkdir. */
    shoal_layout one = SHOAL_LAYOUT_INHERIT;
    one.replicas = 1;
    CHECK(shoal_set_layout(c, "/r", &one) == 0);
    shoal_layout l;
    CHECK(shoal_get_layout(c, "/r", &l, NULL, 0) == 0 && memcmp(&l, &one, sizeof l) == 0);
    make(c, "/r/inherits", NULL);
    CHECK(replicas_of(c, "/r/inherits") == 1);
    CHECK(shoal_mkdir(c, "/r/sub", 0755) == 0);
    CHECK(replicas_of(c, "/r/sub") == 1);
    make(c, "/r/sub/deep", NULL);
    CHECK(replicas_of(c, "/r/sub/deep") == 1);

    /* A file's own count before the directory's; 3 is capped to the cluster's 2. */
    shoal_layout two = SHOAL_LAYOUT_INHERIT;
    two.replicas = 2;
    make(c, "/r/two", &two);
    CHECK(replicas_of(c, "/r/two") == 2);
    shoal_layout three = SHOAL_LAYOUT_INHERIT;
    three.replicas = 3;
    make(c, "/r/three", &three);
    CHECK(replicas_of(c, "/r/three") == 2);
    /* A directory keeps 3 as asked; its files get 2. */
    CHECK(shoal_mkdir(c, "/r3", 0755) == 0);
    CHECK(shoal_set_layout(c, "/r3", &three) == 0);
    CHECK(replicas_of(c, "/r3") == 3);
    make(c, "/r3/f", NULL);
    CHECK(replicas_of(c, "/r3/f") == 2);

    /* Bad counts: EINVAL at the call, with the reason; nothing changes. */
    shoal_layout bad = SHOAL_LAYOUT_INHERIT;
    bad.replicas = 4;
    CHECK(shoal_set_layout(c, "/r", &bad) == -1 && errno == EINVAL);
    CHECK(strstr(shoal_last_error(), "replica count 4") != NULL);
    CHECK(shoal_create(c, "/r/bad", O_WRONLY, 0644, &bad) == NULL && errno == EINVAL);
    bad = SHOAL_LAYOUT_INHERIT;
    bad.reserved = 1;
    CHECK(shoal_set_layout(c, "/r", &bad) == -1 && errno == EINVAL);
    CHECK(replicas_of(c, "/r") == 1);
    CHECK(shoal_get_layout(c, "/r/bad", &l, NULL, 0) == -1 && errno == ENOENT);

    /* The asynchronous twin reports the same. */
    shoal_layout la;
    memset(&la, 0xff, sizeof la);
    shoal_future *f = shoal_get_layout_async(c, "/r/two", &la, NULL, 0, NULL, NULL);
    int64_t r = 0;
    CHECK(f != NULL && shoal_future_wait(f, &r) == 0);
    shoal_future_free(f);
    CHECK(r == 1 && la.replicas == 2 && la.reserved == 0);

    shoal_disconnect(c);
    puts("ok");
    return 0;
}
