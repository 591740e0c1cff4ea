/* libshoal from C against real servers: metadata queries (shoal_find, docs/find.md) with
 * find(1)-style tests, their matches and their errors. Run by c_api.rs with the cluster's
 * configuration as argv[1]; prints "ok" and exits 0, or names the failed check. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

static void make(shoal_client *c, const char *path, size_t size) {
    shoal_file *f = shoal_open(c, path, O_CREAT | O_WRONLY | O_EXCL, 0644);
    CHECK(f != NULL);
    char buf[4096] = {0};
    CHECK(size <= sizeof buf);
    if (size > 0) {
        CHECK(shoal_pwrite(f, buf, size, 0) == (ssize_t)size);
    }
    CHECK(shoal_close(f) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    CHECK(shoal_mkdir(c, "/q", 0755) == 0);
    CHECK(shoal_mkdir(c, "/q/sub", 0755) == 0);
    char path[64];
    for (int i = 0; i < 20; i++) {
        snprintf(path, sizeof path, "/q/sub/run%02d.h5", i);
        make(c, path, i < 5 ? 3000 : 0);
    }
    make(c, "/q/notes.txt", 10);
    CHECK(shoal_chmod(c, "/q/notes.txt", 0600) == 0);

    /* Everything: /q, /q/notes.txt, /q/sub and its 20 files, sorted by path. */
    shoal_found *f = shoal_find(c, "/q", NULL);
    CHECK(f != NULL && shoal_found_count(f) == 23);
    const shoal_match *m = shoal_found_next(f);
    CHECK(m != NULL && strcmp(m->path, "/q") == 0 && S_ISDIR(m->attr.mode));
    m = shoal_found_next(f);
    CHECK(m != NULL && strcmp(m->path, "/q/notes.txt") == 0 && m->attr.size == 10);
    int n = 2;
    while (shoal_found_next(f) != NULL) {
        n++;
    }
    CHECK(n == 23 && shoal_found_next(f) == NULL);
    CHECK(shoal_found_free(f) == 0);

    /* Tests: name and size, as find -name '*.h5' -size +2k. */
    shoal_find_query q;
    CHECK(shoal_find_query_init(&q) == 0);
    q.name = "*.h5";
    q.size = "+2k";
    f = shoal_find(c, "/q", &q);
    CHECK(f != NULL && shoal_found_count(f) == 5);
    m = shoal_found_next(f);
    CHECK(m != NULL && strcmp(m->path, "/q/sub/run00.h5") == 0 && m->attr.size == 3000 && S_ISREG(m->attr.mode));
    CHECK(shoal_found_free(f) == 0);

    /* Permission bits, type and depth. */
    CHECK(shoal_find_query_init(&q) == 0);
    q.perm = "600";
    q.type_ = "f";
    q.maxdepth = 1;
    f = shoal_find(c, "/q", &q);
    CHECK(f != NULL && shoal_found_count(f) == 1);
    CHECK(strcmp(shoal_found_next(f)->path, "/q/notes.txt") == 0);
    CHECK(shoal_found_free(f) == 0);

    /* Nothing matches: an empty answer, not an error. */
    CHECK(shoal_find_query_init(&q) == 0);
    q.name = "*.nothing";
    f = shoal_find(c, "/q", &q);
    CHECK(f != NULL && shoal_found_count(f) == 0 && shoal_found_next(f) == NULL);
    CHECK(shoal_found_free(f) == 0);

    /* Errors: a test that does not parse (EINVAL, named), no such path, NULL arguments. */
    CHECK(shoal_find_query_init(&q) == 0);
    q.size = "big";
    CHECK(shoal_find(c, "/q", &q) == NULL && errno == EINVAL && strstr(shoal_last_error(), "size") != NULL);
    CHECK(shoal_find(c, "/nope", NULL) == NULL && errno == ENOENT);
    CHECK(shoal_find(c, NULL, NULL) == NULL && errno == EFAULT);
    CHECK(shoal_found_next(NULL) == NULL && errno == EFAULT);
    CHECK(shoal_find_query_init(NULL) == -1 && errno == EFAULT);
    CHECK(shoal_found_count(NULL) == 0 && shoal_found_free(NULL) == 0);

    shoal_disconnect(c);
    printf("ok\n");
    return 0;
}
