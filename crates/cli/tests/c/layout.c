/* libshoal's layouts from C against real servers (4 of them, cluster default: 1 stripe):
 * files created with a layout report it, a directory's default is kept and inherited, a
 * file's layout cannot be changed, the asynchronous twins give the blocking calls' answers,
 * and errors come as errno (blocking) or -errno (futures). Run by c_api.rs with the
 * cluster's configuration as argv[1]. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define SERVERS 4

/* The result of a future, which is then freed. */
static int64_t result_of(shoal_future *f) {
    int64_t r = 0;
    CHECK(f != NULL && shoal_future_wait(f, &r) == 0);
    shoal_future_free(f);
    return r;
}

/* `path`'s layout and servers; checks the servers are distinct real ids. Returns the count. */
static int layout_of(shoal_client *c, const char *path, shoal_layout *l, uint32_t *servers) {
    memset(servers, 0xff, SERVERS * sizeof *servers);
    intptr_t n = shoal_get_layout(c, path, l, servers, SERVERS);
    CHECK(n >= 0 && n <= SERVERS);
    for (intptr_t i = 0; i < n; i++) {
        CHECK(servers[i] < SERVERS);
        for (intptr_t j = 0; j < i; j++) CHECK(servers[i] != servers[j]);
    }
    return (int)n;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    CHECK(shoal_mkdir(c, "/l", 0755) == 0);
    shoal_layout l, want;
    uint32_t servers[SERVERS];

    /* A directory without a default: everything unset, no servers. */
    CHECK(layout_of(c, "/l", &l, servers) == 0);
    want = SHOAL_LAYOUT_INHERIT;
    CHECK(memcmp(&l, &want, sizeof l) == 0);

    /* A file made with 2 stripes of 64 KiB reports them, and holds data across them. */
    shoal_layout two = SHOAL_LAYOUT_INHERIT;
    two.stripe_count = 2;
    two.stripe_size = 65536;
    shoal_file *f = shoal_create(c, "/l/two", O_RDWR | O_EXCL, 0640, &two);
    CHECK(f != NULL);
    static char data[256 * 1024], back[256 * 1024];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)(i * 7 + i / 65536);
    CHECK(shoal_pwrite(f, data, sizeof data, 0) == (intptr_t)sizeof data);
    CHECK(shoal_close(f) == 0);
    CHECK(layout_of(c, "/l/two", &l, servers) == 2);
    CHECK(l.stripe_count == 2 && l.stripe_size == 65536 && l.policy == SHOAL_POLICY_UNSET);
    CHECK(l.first_server == (int64_t)servers[0]);
    f = shoal_open(c, "/l/two", O_RDONLY, 0);
    CHECK(f != NULL && shoal_pread(f, back, sizeof back, 0) == (intptr_t)sizeof back);
    CHECK(memcmp(data, back, sizeof data) == 0 && shoal_close(f) == 0);
    /* A capacity of 0 asks for the count; a short one is ERANGE, writing nothing. */
    CHECK(shoal_get_layout(c, "/l/two", &l, NULL, 0) == 2);
    shoal_layout untouched = {7, 7, 7, 7, 7, 0};
    uint32_t one = 99;
    CHECK(shoal_get_layout(c, "/l/two", &untouched, &one, 1) == -1 && errno == ERANGE && one == 99);
    CHECK(untouched.stripe_size == 7 && untouched.first_server == 7);

    /* The first server can be chosen (server 0 is a real one), or all servers used. */
    for (int64_t s = 0; s < SERVERS; s++) {
        char path[32];
        snprintf(path, sizeof path, "/l/pinned%d", (int)s);
        shoal_layout pin = SHOAL_LAYOUT_INHERIT;
        pin.first_server = s;
        f = shoal_create(c, path, O_WRONLY | O_EXCL, 0644, &pin);
        CHECK(f != NULL && shoal_close(f) == 0);
        CHECK(layout_of(c, path, &l, servers) == 1 && servers[0] == (uint32_t)s && l.first_server == s);
    }
    shoal_layout all = SHOAL_LAYOUT_INHERIT;
    all.stripe_count = SHOAL_STRIPE_COUNT_ALL;
    f = shoal_create(c, "/l/all", O_WRONLY | O_EXCL, 0644, &all);
    CHECK(f != NULL && shoal_close(f) == 0);
    CHECK(layout_of(c, "/l/all", &l, servers) == SERVERS && l.stripe_count == SERVERS);

    /* A directory's default: kept as set, unset fields left unset, inherited by new files. */
    shoal_layout def = SHOAL_LAYOUT_INHERIT;
    def.stripe_count = 3;
    def.stripe_size = 131072;
    def.policy = SHOAL_POLICY_SPREAD;
    CHECK(shoal_set_layout(c, "/l", &def) == 0);
    CHECK(layout_of(c, "/l", &l, servers) == 0 && memcmp(&l, &def, sizeof l) == 0);
    f = shoal_open(c, "/l/inherits", O_CREAT | O_EXCL | O_WRONLY, 0644);
    CHECK(f != NULL && shoal_close(f) == 0);
    CHECK(layout_of(c, "/l/inherits", &l, servers) == 3 && l.stripe_size == 131072);
    f = shoal_create(c, "/l/inherits-too", O_WRONLY, 0644, NULL); /* NULL: the directory's */
    CHECK(f != NULL && shoal_close(f) == 0);
    CHECK(layout_of(c, "/l/inherits-too", &l, servers) == 3 && l.stripe_size == 131072);
    shoal_layout bigger = SHOAL_LAYOUT_INHERIT;
    bigger.stripe_size = 1 << 20; /* the rest from the directory */
    f = shoal_create(c, "/l/mixed", O_WRONLY | O_EXCL, 0644, &bigger);
    CHECK(f != NULL && shoal_close(f) == 0);
    CHECK(layout_of(c, "/l/mixed", &l, servers) == 3 && l.stripe_size == 1 << 20);
    CHECK(shoal_mkdir(c, "/l/sub", 0755) == 0);
    CHECK(layout_of(c, "/l/sub", &l, servers) == 0 && l.stripe_count == 3 && l.policy == SHOAL_POLICY_SPREAD);

    /* A file's layout is fixed: EEXIST; an existing file keeps its own at create. */
    CHECK(shoal_set_layout(c, "/l/two", &def) == -1 && errno == EEXIST);
    shoal_layout single = SHOAL_LAYOUT_INHERIT;
    single.stripe_count = 1;
    f = shoal_create(c, "/l/two", O_WRONLY, 0644, &single);
    CHECK(f != NULL && shoal_close(f) == 0);
    CHECK(layout_of(c, "/l/two", &l, servers) == 2);
    CHECK(shoal_create(c, "/l/two", O_WRONLY | O_EXCL, 0644, &single) == NULL && errno == EEXIST);

    /* Bad arguments and values. */
    CHECK(shoal_set_layout(c, "/l", NULL) == -1 && errno == EFAULT);
    shoal_layout bad = SHOAL_LAYOUT_INHERIT;
    bad.policy = 7;
    CHECK(shoal_set_layout(c, "/l", &bad) == -1 && errno == EINVAL);
    CHECK(shoal_create(c, "/l/bad", O_WRONLY, 0644, &bad) == NULL && errno == EINVAL);
    bad = SHOAL_LAYOUT_INHERIT;
    bad.first_server = -5;
    CHECK(shoal_set_layout(c, "/l", &bad) == -1 && errno == EINVAL);
    bad = SHOAL_LAYOUT_INHERIT;
    bad.stripe_size = 1000; /* not a multiple of 4 KiB: the servers say EINVAL */
    CHECK(shoal_set_layout(c, "/l", &bad) == -1 && errno == EINVAL);
    CHECK(shoal_create(c, "/l/bad", O_WRONLY, 0644, &bad) == NULL && errno == EINVAL);
    bad = SHOAL_LAYOUT_INHERIT;
    bad.stripe_count = SERVERS + 1;
    CHECK(shoal_set_layout(c, "/l", &bad) == -1 && errno == EINVAL);
    CHECK(strlen(shoal_last_error()) > 0);
    CHECK(shoal_get_layout(c, "/l/nope", &l, servers, SERVERS) == -1 && errno == ENOENT);
    CHECK(shoal_get_layout(c, "/l/two", NULL, servers, SERVERS) == -1 && errno == EFAULT);
    CHECK(shoal_get_layout(c, "/l/two", &l, NULL, SERVERS) == -1 && errno == EFAULT);
    CHECK(layout_of(c, "/l", &l, servers) == 0 && memcmp(&l, &def, sizeof l) == 0); /* unchanged */

    /* Read-mostly marks: set, inherited by what is made in the directory, cleared. */
    CHECK(shoal_is_read_mostly(c, "/l") == 0);
    CHECK(shoal_set_read_mostly(c, "/l", 1) == 0 && shoal_is_read_mostly(c, "/l") == 1);
    CHECK(shoal_mkdir(c, "/l/rm", 0755) == 0 && shoal_is_read_mostly(c, "/l/rm") == 1);
    CHECK(shoal_set_read_mostly(c, "/l", 0) == 0 && shoal_is_read_mostly(c, "/l") == 0);
    CHECK(shoal_set_read_mostly(c, "/l/nope", 1) == -1 && errno == ENOENT);
    CHECK(shoal_is_read_mostly(c, "/l/nope") == -1 && errno == ENOENT);

    /* The asynchronous twins give the same answers, errors as -errno. */
    shoal_layout la;
    uint32_t sa[SERVERS];
    const char *paths[] = {"/l", "/l/two", "/l/all", "/l/pinned0", "/l/mixed", "/l/sub"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        int n = layout_of(c, paths[i], &l, servers);
        memset(&la, 0, sizeof la);
        CHECK(result_of(shoal_get_layout_async(c, paths[i], &la, sa, SERVERS, NULL, NULL)) == n);
        CHECK(memcmp(&l, &la, sizeof l) == 0 && memcmp(servers, sa, (size_t)n * sizeof *sa) == 0);
    }
    CHECK(result_of(shoal_get_layout_async(c, "/l/two", &la, NULL, 0, NULL, NULL)) == 2);
    CHECK(result_of(shoal_get_layout_async(c, "/l/two", &la, sa, 1, NULL, NULL)) == -ERANGE);
    CHECK(result_of(shoal_get_layout_async(c, "/l/nope", &la, sa, SERVERS, NULL, NULL)) == -ENOENT);
    CHECK(shoal_get_layout_async(c, "/l", NULL, sa, SERVERS, NULL, NULL) == NULL && errno == EFAULT);

    CHECK(shoal_mkdir(c, "/l/async", 0755) == 0);
    shoal_layout adef = SHOAL_LAYOUT_INHERIT;
    adef.stripe_count = 2;
    adef.first_server = 1;
    shoal_future *fut = shoal_set_layout_async(c, "/l/async", &adef, NULL, NULL);
    adef.stripe_count = 4; /* copied at the call: this does not count */
    CHECK(result_of(fut) == 0);
    CHECK(layout_of(c, "/l/async", &l, servers) == 0 && l.stripe_count == 2 && l.first_server == 1);
    CHECK(result_of(shoal_set_layout_async(c, "/l/two", &adef, NULL, NULL)) == -EEXIST);
    CHECK(result_of(shoal_set_layout_async(c, "/l/async", &bad, NULL, NULL)) == -EINVAL);
    bad.policy = 9;
    CHECK(shoal_set_layout_async(c, "/l/async", &bad, NULL, NULL) == NULL && errno == EINVAL);
    CHECK(shoal_set_layout_async(c, "/l/async", NULL, NULL, NULL) == NULL && errno == EFAULT);

    shoal_file *af = NULL;
    CHECK(result_of(shoal_create_async(c, "/l/async/a", O_RDWR | O_EXCL, 0600, NULL, &af, NULL, NULL)) == 0);
    CHECK(af != NULL && shoal_pwrite(af, "x", 1, 0) == 1 && shoal_close(af) == 0);
    CHECK(layout_of(c, "/l/async/a", &l, servers) == 2 && servers[0] == 1); /* the directory's */
    shoal_layout three = SHOAL_LAYOUT_INHERIT;
    three.stripe_count = 3;
    af = NULL;
    CHECK(result_of(shoal_create_async(c, "/l/async/b", O_RDWR | O_EXCL, 0600, &three, &af, NULL, NULL)) == 0);
    CHECK(af != NULL && shoal_close(af) == 0);
    CHECK(layout_of(c, "/l/async/b", &l, servers) == 3 && servers[0] == 1);
    CHECK(result_of(shoal_create_async(c, "/l/async/b", O_RDWR | O_EXCL, 0600, &three, &af, NULL, NULL)) ==
          -EEXIST);
    CHECK(shoal_create_async(c, "/l/async/c", O_RDWR, 0600, &bad, &af, NULL, NULL) == NULL && errno == EINVAL);
    CHECK(shoal_create_async(c, "/l/async/c", O_RDWR, 0600, &three, NULL, NULL, NULL) == NULL && errno == EFAULT);

    shoal_disconnect(c);
    puts("ok");
    return 0;
}
