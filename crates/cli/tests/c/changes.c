/* libshoal from C against real servers: the change log (docs/changes.md). A watch on a
 * directory sees creates, mkdirs, renames (inside, into a subdirectory, out of the watched
 * tree), symlinks, unlinks and rmdirs made through the C API, in order, with their paths,
 * inodes and types; a second watch sees only the closes and extended attributes of *.h5
 * files; a consumer reads some events, acknowledges, stops, and opened again gets exactly
 * the events it did not acknowledge; a watch from the oldest event; a forgotten consumer
 * starts anew; timeouts and errors. Run by c_api.rs with the cluster's configuration as
 * argv[1]; prints "ok" and exits 0, or names the failed check. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Equal strings, or both NULL. */
static int same(const char *a, const char *b) {
    return (a == NULL || b == NULL) ? a == b : strcmp(a, b) == 0;
}

/* Write `path` (created, one byte) and close it. */
static void write_file(shoal_client *c, const char *path) {
    shoal_file *f = shoal_open(c, path, O_CREAT | O_WRONLY | O_EXCL, 0644);
    CHECK(f != NULL);
    CHECK(shoal_pwrite(f, "x", 1, 0) == 1);
    CHECK(shoal_close(f) == 0);
}

/* The next event of `w` (waiting up to 10 s) into `ev`; it must be `kind` on `path`
 * (`to_path` for a rename), and come after the event `*last` of the same server. */
static void expect(shoal_change_watch *w, shoal_change_event *ev, int kind, const char *name, const char *path,
                   const char *to_path, uint64_t *last) {
    CHECK(shoal_change_watch_next(w, 10000, ev) == 1);
    if (ev->kind != kind || !same(ev->path, path) || !same(ev->to_path, to_path)) {
        fprintf(stderr, "expected %s %s -> %s, got %s (%d) %s -> %s\n", name, path, to_path ? to_path : "NULL",
                ev->kind_name, ev->kind, ev->path ? ev->path : "NULL", ev->to_path ? ev->to_path : "NULL");
    }
    CHECK(ev->kind == kind && strcmp(ev->kind_name, name) == 0);
    CHECK(same(ev->path, path) && same(ev->to_path, to_path));
    CHECK(ev->ino > 0 && ev->at_sec > 0 && ev->at_nsec < 1000000000u);
    CHECK(kind == SHOAL_CHANGE_XATTR || ev->xattr == NULL);
    if (last != NULL) {
        CHECK(ev->seq > *last);
        *last = ev->seq;
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    CHECK(shoal_mkdir(c, "/cw", 0755) == 0 && shoal_mkdir(c, "/other", 0755) == 0);

    /* Entry events of /cw's own entries, all logged by the server of /cw: in its order. */
    shoal_change_watch *w = shoal_change_watch_open(c, "/cw", "create,mkdir,symlink,rename,unlink,rmdir", NULL, 1, NULL, 0);
    CHECK(w != NULL);
    /* h5: closes and extended attributes of *.h5 files only. */
    shoal_change_watch *h5 = shoal_change_watch_open(c, "/cw", "close, xattr", "*.h5", 1, NULL, 0);
    CHECK(h5 != NULL);
    shoal_change_event ev;
    memset(&ev, 0, sizeof ev);
    double t0 = now_ms();
    CHECK(shoal_change_watch_next(w, 200, &ev) == 0 && ev.kind == 0);
    CHECK(now_ms() - t0 >= 190);

    write_file(c, "/cw/a");
    CHECK(shoal_mkdir(c, "/cw/d", 0755) == 0);
    CHECK(shoal_rename(c, "/cw/a", "/cw/b") == 0);
    CHECK(shoal_symlink(c, "b", "/cw/s") == 0);
    CHECK(shoal_rename(c, "/cw/b", "/cw/d/b") == 0);
    CHECK(shoal_unlink(c, "/cw/s") == 0);
    CHECK(shoal_mkdir(c, "/cw/e", 0755) == 0);
    CHECK(shoal_rmdir(c, "/cw/e") == 0);
    CHECK(shoal_rename(c, "/cw/d", "/other/d") == 0);
    write_file(c, "/cw/x.h5");
    write_file(c, "/cw/y.txt");
    CHECK(shoal_setxattr(c, "/cw/x.h5", "user.tag", "hot", 3, 0) == 0);
    CHECK(shoal_setxattr(c, "/cw/y.txt", "user.tag", "cold", 4, 0) == 0);

    shoal_attr b;
    CHECK(shoal_stat(c, "/other/d/b", &b) == 0);
    uint64_t last = 0;
    expect(w, &ev, SHOAL_CHANGE_CREATE, "create", "/cw/a", NULL, &last);
    CHECK(ev.ino == b.ino && ev.file_type == SHOAL_DT_REG);
    uint32_t server = ev.server;
    expect(w, &ev, SHOAL_CHANGE_MKDIR, "mkdir", "/cw/d", NULL, &last);
    CHECK(ev.file_type == SHOAL_DT_DIR && ev.server == server);
    expect(w, &ev, SHOAL_CHANGE_RENAME, "rename", "/cw/a", "/cw/b", &last);
    CHECK(ev.ino == b.ino && ev.file_type == SHOAL_DT_REG);
    expect(w, &ev, SHOAL_CHANGE_SYMLINK, "symlink", "/cw/s", NULL, &last);
    CHECK(ev.file_type == SHOAL_DT_LNK);
    expect(w, &ev, SHOAL_CHANGE_RENAME, "rename", "/cw/b", "/cw/d/b", &last);
    CHECK(ev.ino == b.ino);
    expect(w, &ev, SHOAL_CHANGE_UNLINK, "unlink", "/cw/s", NULL, &last);
    CHECK(ev.file_type == SHOAL_DT_LNK);
    expect(w, &ev, SHOAL_CHANGE_MKDIR, "mkdir", "/cw/e", NULL, &last);
    expect(w, &ev, SHOAL_CHANGE_RMDIR, "rmdir", "/cw/e", NULL, &last);
    CHECK(ev.file_type == SHOAL_DT_DIR);
    /* Out of the watched tree: no new path. */
    expect(w, &ev, SHOAL_CHANGE_RENAME, "rename", "/cw/d", NULL, &last);
    CHECK(ev.file_type == SHOAL_DT_DIR && ev.server == server);
    expect(w, &ev, SHOAL_CHANGE_CREATE, "create", "/cw/x.h5", NULL, &last);
    expect(w, &ev, SHOAL_CHANGE_CREATE, "create", "/cw/y.txt", NULL, &last);
    CHECK(shoal_change_watch_next(w, 300, &ev) == 0);
    CHECK(shoal_change_watch_lost(w) == 0);
    /* Not a consumer's watch: nothing to acknowledge. */
    CHECK(shoal_change_watch_ack(w) == -1 && errno == EINVAL);
    CHECK(shoal_change_watch_free(w) == 0);

    /* Close and xattr are logged by the file's home, in its order. */
    shoal_attr x;
    CHECK(shoal_stat(c, "/cw/x.h5", &x) == 0);
    last = 0;
    expect(h5, &ev, SHOAL_CHANGE_CLOSE, "close", "/cw/x.h5", NULL, &last);
    CHECK(ev.ino == x.ino && ev.file_type == SHOAL_DT_REG);
    expect(h5, &ev, SHOAL_CHANGE_XATTR, "xattr", "/cw/x.h5", NULL, &last);
    CHECK(ev.xattr != NULL && strcmp(ev.xattr, "user.tag") == 0);
    CHECK(shoal_change_watch_next(h5, 300, &ev) == 0);
    CHECK(shoal_change_watch_free(h5) == 0);

    /* A consumer: 3 of 6 creates read and acknowledged, then stopped; 2 more made while it
     * is stopped. All in /cq, logged by one server: in order. */
    const char *name = "c-ingest";
    CHECK(shoal_mkdir(c, "/cq", 0755) == 0);
    w = shoal_change_watch_open(c, "/cq", "create", NULL, 1, name, 0);
    CHECK(w != NULL);
    char path[64];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "/cq/f%d", i);
        write_file(c, path);
    }
    last = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "/cq/f%d", i);
        expect(w, &ev, SHOAL_CHANGE_CREATE, "create", path, NULL, &last);
    }
    CHECK(shoal_change_watch_ack(w) == 0);
    CHECK(shoal_change_watch_free(w) == 0);
    for (int i = 6; i < 8; i++) {
        snprintf(path, sizeof path, "/cq/f%d", i);
        write_file(c, path);
    }
    /* Opened again: f3 handed out and not acknowledged, then stopped... */
    w = shoal_change_watch_open(c, "/cq", "create", NULL, 1, name, 0);
    CHECK(w != NULL);
    expect(w, &ev, SHOAL_CHANGE_CREATE, "create", "/cq/f3", NULL, NULL);
    CHECK(shoal_change_watch_free(w) == 0);
    /* ... comes again: exactly f3 to f7, none missed, none repeated. */
    w = shoal_change_watch_open(c, "/cq", "create", NULL, 1, name, 0);
    CHECK(w != NULL);
    for (int i = 3; i < 8; i++) {
        snprintf(path, sizeof path, "/cq/f%d", i);
        expect(w, &ev, SHOAL_CHANGE_CREATE, "create", path, NULL, &last);
    }
    CHECK(shoal_change_watch_next(w, 300, &ev) == 0);
    CHECK(shoal_change_watch_ack(w) == 0 && shoal_change_watch_lost(w) == 0);
    CHECK(shoal_change_watch_free(w) == 0);
    /* Everything acknowledged: nothing more. */
    w = shoal_change_watch_open(c, "/cq", "create", NULL, 1, name, 0);
    CHECK(w != NULL);
    CHECK(shoal_change_watch_next(w, 300, &ev) == 0);
    CHECK(shoal_change_watch_free(w) == 0);

    /* From the oldest event the servers keep: f0 first, as nobody has forgotten. */
    w = shoal_change_watch_open(c, "/cq", "create", NULL, 0, NULL, 1);
    CHECK(w != NULL);
    for (int i = 0; i < 8; i++) {
        snprintf(path, sizeof path, "/cq/f%d", i);
        expect(w, &ev, SHOAL_CHANGE_CREATE, "create", path, NULL, NULL);
    }
    CHECK(shoal_change_watch_free(w) == 0);

    /* A forgotten consumer starts anew, from now: f8 made before it is not seen. */
    CHECK(shoal_forget_consumer(c, name) == 0);
    write_file(c, "/cq/f8");
    w = shoal_change_watch_open(c, "/cq", "create", NULL, 1, name, 0);
    CHECK(w != NULL);
    write_file(c, "/cq/f9");
    expect(w, &ev, SHOAL_CHANGE_CREATE, "create", "/cq/f9", NULL, NULL);
    CHECK(shoal_change_watch_next(w, 300, &ev) == 0);
    CHECK(shoal_change_watch_free(w) == 0);
    CHECK(shoal_forget_consumer(c, name) == 0);

    /* Errors. */
    CHECK(shoal_change_watch_open(c, NULL, NULL, NULL, 1, NULL, 0) == NULL && errno == EFAULT);
    CHECK(shoal_change_watch_open(NULL, "/cq", NULL, NULL, 1, NULL, 0) == NULL && errno == EFAULT);
    CHECK(shoal_change_watch_open(c, "/cq\xff", NULL, NULL, 1, NULL, 0) == NULL && errno == EINVAL);
    CHECK(shoal_change_watch_open(c, "/cq", "create,bogus", NULL, 1, NULL, 0) == NULL && errno == EINVAL &&
          strstr(shoal_last_error(), "bogus") != NULL);
    CHECK(shoal_change_watch_open(c, "/cq", "", NULL, 1, NULL, 0) == NULL && errno == EINVAL);
    CHECK(shoal_change_watch_open(c, "/cq", "create\xff", NULL, 1, NULL, 0) == NULL && errno == EINVAL);
    CHECK(shoal_change_watch_open(c, "/cq", NULL, "[", 1, NULL, 0) == NULL && errno == EINVAL);
    CHECK(shoal_change_watch_open(c, "/cq", NULL, NULL, 1, "a/b", 0) == NULL && errno == EINVAL);
    CHECK(shoal_change_watch_open(c, "/cq", NULL, NULL, 1, name, 1) == NULL && errno == EINVAL &&
          strstr(shoal_last_error(), "oldest") != NULL);
    CHECK(shoal_change_watch_open(c, "/nope", NULL, NULL, 1, NULL, 0) == NULL && errno == ENOENT);
    CHECK(shoal_change_watch_open(c, "/cq/f0", NULL, NULL, 1, NULL, 0) == NULL && errno == ENOTDIR);
    w = shoal_change_watch_open(c, "/cq", NULL, NULL, 1, NULL, 0);
    CHECK(w != NULL);
    CHECK(shoal_change_watch_next(w, -2, &ev) == -1 && errno == EINVAL);
    CHECK(shoal_change_watch_next(w, 0, NULL) == -1 && errno == EFAULT);
    CHECK(shoal_change_watch_next(w, 0, &ev) == 0);
    CHECK(shoal_change_watch_free(w) == 0);
    CHECK(shoal_change_watch_next(NULL, 0, &ev) == -1 && errno == EFAULT);
    CHECK(shoal_change_watch_ack(NULL) == -1 && errno == EFAULT);
    CHECK(shoal_change_watch_lost(NULL) == -1 && errno == EFAULT);
    CHECK(shoal_change_watch_free(NULL) == 0);
    CHECK(shoal_forget_consumer(c, NULL) == -1 && errno == EFAULT);
    CHECK(shoal_forget_consumer(c, "no spaces") == -1 && errno == EINVAL);
    CHECK(shoal_forget_consumer(NULL, name) == -1 && errno == EFAULT);

    shoal_disconnect(c);
    printf("ok\n");
    return 0;
}
