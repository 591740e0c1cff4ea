/* libshoal from C against real servers: what trees hold (shoal_du, docs/du.md), added up
 * from the usage the servers keep per directory: a known tree's totals, its directories
 * down to a depth, a file and a symbolic link reporting themselves, and the errors. Run by
 * c_api.rs with the cluster's configuration as argv[1]; prints "ok" and exits 0, or names
 * the failed check. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

/* The client, for the rows' checks. */
static shoal_client *fs;

/* The next row of `d` is `path` at `depth` holding `files`, `dirs` and `bytes`. */
static void row(shoal_du_dirs *d, const char *path, size_t depth, uint64_t files, uint64_t dirs, uint64_t bytes) {
    const shoal_du_row *r = shoal_du_next(d);
    CHECK(r != NULL);
    if (strcmp(r->path, path) != 0 || r->depth != depth || r->files != files || r->dirs != dirs ||
        r->bytes != bytes || r->inodes != files + dirs + 1) {
        fprintf(stderr, "row %s depth %zu files %llu dirs %llu bytes %llu inodes %llu; expected %s %zu %llu %llu %llu\n",
                r->path, r->depth, (unsigned long long)r->files, (unsigned long long)r->dirs,
                (unsigned long long)r->bytes, (unsigned long long)r->inodes, path, depth,
                (unsigned long long)files, (unsigned long long)dirs, (unsigned long long)bytes);
        CHECK(0);
    }
    shoal_attr a;
    CHECK(shoal_lstat(fs, path, &a) == 0 && a.ino == r->ino);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    fs = c;
    /* /du: a/ (f1 100 B, f2 250 B, hard = f1 again, b/ (f3 4000 B), e/ (empty)),
     *      c/ (ln -> "../a/f1", 7 B), top (1 B). */
    const char *dirs[] = {"/du", "/du/a", "/du/a/b", "/du/a/e", "/du/c"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        CHECK(shoal_mkdir(c, dirs[i], 0755) == 0);
    }
    make(c, "/du/a/f1", 100);
    make(c, "/du/a/f2", 250);
    make(c, "/du/a/b/f3", 4000);
    make(c, "/du/top", 1);
    CHECK(shoal_link(c, "/du/a/f1", "/du/a/hard") == 0);
    CHECK(shoal_symlink(c, "../a/f1", "/du/c/ln") == 0);

    /* Totals: 5 files (the hard link counted once, the symbolic link as a file of its
     * target's length), 4 directories below /du, 100 + 250 + 4000 + 7 + 1 bytes. */
    shoal_du_totals t;
    memset(&t, 0xff, sizeof t);
    CHECK(shoal_du(c, "/du", &t) == 0);
    CHECK(t.files == 5 && t.dirs == 4 && t.bytes == 4358 && t.inodes == 10 && t.unreadable == 0);
    CHECK(shoal_du(c, "/du/a", &t) == 0);
    CHECK(t.files == 3 && t.dirs == 2 && t.bytes == 4350 && t.inodes == 6 && t.unreadable == 0);
    CHECK(shoal_du(c, "/du/a/e", &t) == 0);
    CHECK(t.files == 0 && t.dirs == 0 && t.bytes == 0 && t.inodes == 1);

    /* Directories down to a depth: each before its parent, siblings by name, /du last. */
    shoal_du_dirs *d = shoal_du_open(c, "/du", 0);
    CHECK(d != NULL && shoal_du_count(d) == 1);
    row(d, "/du", 0, 5, 4, 4358);
    CHECK(shoal_du_next(d) == NULL && shoal_du_next(d) == NULL);
    CHECK(shoal_du_free(d) == 0);

    d = shoal_du_open(c, "/du", 1);
    CHECK(d != NULL && shoal_du_count(d) == 3);
    row(d, "/du/a", 1, 3, 2, 4350);
    row(d, "/du/c", 1, 1, 0, 7);
    row(d, "/du", 0, 5, 4, 4358);
    CHECK(shoal_du_next(d) == NULL);
    CHECK(shoal_du_unreadable(d, NULL, 0) == 0);
    CHECK(shoal_du_free(d) == 0);

    d = shoal_du_open(c, "/du/", (size_t)-1); /* every depth; a trailing slash dropped */
    CHECK(d != NULL && shoal_du_count(d) == 5);
    row(d, "/du/a/b", 2, 1, 0, 4000);
    row(d, "/du/a/e", 2, 0, 0, 0);
    row(d, "/du/a", 1, 3, 2, 4350);
    row(d, "/du/c", 1, 1, 0, 7);
    row(d, "/du", 0, 5, 4, 4358);
    CHECK(shoal_du_next(d) == NULL);
    uint64_t inos[4];
    CHECK(shoal_du_unreadable(d, inos, 4) == 0);
    CHECK(shoal_du_free(d) == 0);

    /* A file, and a symbolic link (not followed), report themselves. */
    CHECK(shoal_du(c, "/du/a/f2", &t) == 0);
    CHECK(t.files == 1 && t.dirs == 0 && t.bytes == 250 && t.unreadable == 0);
    CHECK(shoal_du(c, "/du/c/ln", &t) == 0);
    CHECK(t.files == 1 && t.dirs == 0 && t.bytes == 7);
    d = shoal_du_open(c, "/du/a/hard", 3);
    CHECK(d != NULL && shoal_du_count(d) == 1);
    const shoal_du_row *r = shoal_du_next(d);
    CHECK(r != NULL && strcmp(r->path, "/du/a/hard") == 0 && r->depth == 0 && r->files == 1 && r->bytes == 100);
    CHECK(shoal_du_free(d) == 0);

    /* The usage follows changes: a file grows, one is removed, a directory moves. */
    make(c, "/du/c/new", 50);
    CHECK(shoal_unlink(c, "/du/a/f2") == 0);
    CHECK(shoal_rename(c, "/du/a/b", "/du/c/b") == 0);
    CHECK(shoal_du(c, "/du/c", &t) == 0);
    CHECK(t.files == 3 && t.dirs == 1 && t.bytes == 4057);
    CHECK(shoal_du(c, "/du", &t) == 0);
    CHECK(t.files == 5 && t.dirs == 4 && t.bytes == 4158);

    /* Errors: no such path, NULL arguments, a path that is not UTF-8. */
    errno = 0;
    CHECK(shoal_du(c, "/du/missing", &t) == -1 && errno == ENOENT);
    CHECK(strstr(shoal_last_error(), "/du/missing") != NULL);
    CHECK(shoal_du_open(c, "/nope/deeper", 1) == NULL && errno == ENOENT);
    CHECK(shoal_du(NULL, "/du", &t) == -1 && errno == EFAULT);
    CHECK(shoal_du(c, NULL, &t) == -1 && errno == EFAULT);
    CHECK(shoal_du(c, "/du", NULL) == -1 && errno == EFAULT);
    CHECK(shoal_du_open(NULL, "/du", 0) == NULL && errno == EFAULT);
    CHECK(shoal_du_open(c, NULL, 0) == NULL && errno == EFAULT);
    CHECK(shoal_du(c, "/du/\xff", &t) == -1 && errno == EINVAL);
    CHECK(shoal_du_next(NULL) == NULL && errno == EFAULT);
    CHECK(shoal_du_unreadable(NULL, inos, 4) == -1 && errno == EFAULT);
    d = shoal_du_open(c, "/du", 0);
    CHECK(d != NULL);
    CHECK(shoal_du_unreadable(d, NULL, 4) == -1 && errno == EFAULT);
    CHECK(shoal_du_free(d) == 0);
    CHECK(shoal_du_count(NULL) == 0 && shoal_du_free(NULL) == 0);

    shoal_disconnect(c);
    printf("ok\n");
    return 0;
}
