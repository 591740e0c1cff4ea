/* libshoal's asynchronous twins of readlink, chown, utimens, the extended attribute calls,
 * statfs and opendir, from C against real servers: each gives its blocking twin's answer
 * (lengths as results, errors as -errno), copies what it is given before returning, and
 * calls back. Run by c_api.rs with the cluster's configuration as argv[1]. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "check.h"

#define N 50

/* The result of a future, which is then freed. */
static int64_t result_of(shoal_future *f) {
    int64_t r = 0;
    CHECK(f != NULL && shoal_future_wait(f, &r) == 0);
    shoal_future_free(f);
    return r;
}

static atomic_int called;
static atomic_llong result_sum;

static void on_done(int64_t result, void *user) {
    CHECK(user == (void *)&called);
    atomic_fetch_add(&result_sum, result);
    atomic_fetch_add(&called, 1);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    CHECK(shoal_mkdir(c, "/ma", 0755) == 0);
    shoal_file *f = shoal_open(c, "/ma/f", O_CREAT | O_EXCL | O_WRONLY, 0644);
    CHECK(f != NULL && shoal_pwrite(f, "hello", 5, 0) == 5 && shoal_close(f) == 0);
    CHECK(shoal_symlink(c, "/ma/f", "/ma/ln") == 0);

    /* readlink: the length, the bytes, -ERANGE leaving the buffer alone, -EINVAL. */
    char target[64], blocking[64];
    memset(target, 0, sizeof target);
    memset(blocking, 0, sizeof blocking);
    CHECK(shoal_readlink(c, "/ma/ln", blocking, sizeof blocking) == 5);
    CHECK(result_of(shoal_readlink_async(c, "/ma/ln", target, sizeof target, NULL, NULL)) == 5);
    CHECK(memcmp(target, blocking, sizeof target) == 0);
    CHECK(result_of(shoal_readlink_async(c, "/ma/ln", NULL, 0, NULL, NULL)) == 5);
    memset(target, 'z', sizeof target);
    CHECK(result_of(shoal_readlink_async(c, "/ma/ln", target, 3, NULL, NULL)) == -ERANGE && target[0] == 'z');
    CHECK(result_of(shoal_readlink_async(c, "/ma/f", target, sizeof target, NULL, NULL)) == -EINVAL);
    CHECK(result_of(shoal_readlink_async(c, "/ma/none", target, sizeof target, NULL, NULL)) == -ENOENT);
    CHECK(shoal_readlink_async(c, "/ma/ln", NULL, 8, NULL, NULL) == NULL && errno == EFAULT);
    CHECK(shoal_readlink_async(NULL, "/ma/ln", target, 8, NULL, NULL) == NULL && errno == EFAULT);

    /* chown and utimens, seen by stat. */
    shoal_attr a, b;
    CHECK(shoal_stat(c, "/ma/f", &a) == 0);
    CHECK(result_of(shoal_chown_async(c, "/ma/f", 4321, (uint32_t)-1, NULL, NULL)) == 0);
    CHECK(shoal_stat(c, "/ma/f", &b) == 0 && b.uid == 4321 && b.gid == a.gid);
    CHECK(result_of(shoal_chown_async(c, "/ma/none", 1, 1, NULL, NULL)) == -ENOENT);
    shoal_time times[2] = {{1100000000, 7}, {1200000000, 9}};
    shoal_future *fut = shoal_utimens_async(c, "/ma/f", times, NULL, NULL);
    times[0].sec = 5; /* read at the call: this does not count */
    CHECK(result_of(fut) == 0);
    CHECK(shoal_stat(c, "/ma/f", &b) == 0 && b.atime_sec == 1100000000 && b.atime_nsec == 7);
    CHECK(b.mtime_sec == 1200000000 && b.mtime_nsec == 9);
    shoal_time omit[2] = {{0, SHOAL_UTIME_OMIT}, {1300000000, 0}};
    CHECK(result_of(shoal_utimens_async(c, "/ma/f", omit, NULL, NULL)) == 0);
    CHECK(shoal_stat(c, "/ma/f", &a) == 0 && a.atime_sec == 1100000000 && a.mtime_sec == 1300000000);
    CHECK(result_of(shoal_utimens_async(c, "/ma/f", NULL, NULL, NULL)) == 0);
    CHECK(shoal_stat(c, "/ma/f", &a) == 0 && a.mtime_sec > 1300000000);
    shoal_time bad[2] = {{0, 2000000000}, {0, 0}};
    CHECK(shoal_utimens_async(c, "/ma/f", bad, NULL, NULL) == NULL && errno == EINVAL);

    /* Extended attributes: the value is copied at the call; the flags' errors; lengths. */
    char value[16];
    memcpy(value, "hello", 5);
    fut = shoal_setxattr_async(c, "/ma/f", "user.a", value, 5, 0, NULL, NULL);
    memcpy(value, "XXXXX", 5);
    CHECK(result_of(fut) == 0);
    CHECK(result_of(shoal_setxattr_async(c, "/ma/f", "user.a", "x", 1, XATTR_CREATE, NULL, NULL)) == -EEXIST);
    CHECK(result_of(shoal_setxattr_async(c, "/ma/f", "user.b", "x", 1, XATTR_REPLACE, NULL, NULL)) == -ENODATA);
    CHECK(result_of(shoal_setxattr_async(c, "/ma/f", "user.b", NULL, 0, 0, NULL, NULL)) == 0);
    CHECK(shoal_setxattr_async(c, "/ma/f", "user.c", NULL, 3, 0, NULL, NULL) == NULL && errno == EFAULT);
    CHECK(shoal_setxattr_async(c, "/ma/f", NULL, "x", 1, 0, NULL, NULL) == NULL && errno == EFAULT);
    memset(value, 0, sizeof value);
    CHECK(result_of(shoal_getxattr_async(c, "/ma/f", "user.a", NULL, 0, NULL, NULL)) == 5);
    CHECK(result_of(shoal_getxattr_async(c, "/ma/f", "user.a", value, 2, NULL, NULL)) == -ERANGE && value[0] == 0);
    CHECK(result_of(shoal_getxattr_async(c, "/ma/f", "user.a", value, sizeof value, NULL, NULL)) == 5);
    CHECK(memcmp(value, "hello", 5) == 0);
    CHECK(result_of(shoal_getxattr_async(c, "/ma/ln", "user.a", value, sizeof value, NULL, NULL)) == 5);
    CHECK(result_of(shoal_getxattr_async(c, "/ma/f", "user.none", value, sizeof value, NULL, NULL)) == -ENODATA);
    char names[64], names_blocking[64];
    memset(names, 0, sizeof names);
    memset(names_blocking, 0, sizeof names_blocking);
    intptr_t n = shoal_listxattr(c, "/ma/f", names_blocking, sizeof names_blocking);
    CHECK(n == 14);
    CHECK(result_of(shoal_listxattr_async(c, "/ma/f", NULL, 0, NULL, NULL)) == n);
    CHECK(result_of(shoal_listxattr_async(c, "/ma/f", names, 5, NULL, NULL)) == -ERANGE);
    CHECK(result_of(shoal_listxattr_async(c, "/ma/f", names, sizeof names, NULL, NULL)) == n);
    CHECK(memcmp(names, names_blocking, sizeof names) == 0);
    CHECK(result_of(shoal_removexattr_async(c, "/ma/f", "user.a", NULL, NULL)) == 0);
    CHECK(result_of(shoal_removexattr_async(c, "/ma/f", "user.a", NULL, NULL)) == -ENODATA);
    CHECK(shoal_getxattr(c, "/ma/f", "user.a", value, sizeof value) == -1 && errno == ENODATA);

    /* Many in flight, each calling back with its result. */
    CHECK(shoal_setxattr(c, "/ma/f", "user.a", "hello", 5, 0) == 0);
    shoal_future *futs[N];
    char values[N][8];
    for (int i = 0; i < N; i++) {
        futs[i] = shoal_getxattr_async(c, "/ma/f", "user.a", values[i], sizeof values[i], on_done, &called);
        CHECK(futs[i] != NULL);
    }
    CHECK(shoal_future_wait_all((const shoal_future *const *)futs, N) == 0);
    for (int i = 0; i < N; i++) {
        CHECK(memcmp(values[i], "hello", 5) == 0);
        shoal_future_free(futs[i]);
    }
    /* The callback runs after the result is set: wait for the last ones to return. */
    while (atomic_load(&called) < N) {
    }
    CHECK(atomic_load(&result_sum) == 5 * N);

    /* statfs, as the blocking call sees it. */
    shoal_statfs s, sb;
    CHECK(shoal_statfs_get(c, &sb) == 0);
    memset(&s, 0, sizeof s);
    CHECK(result_of(shoal_statfs_get_async(c, &s, NULL, NULL)) == 0);
    CHECK(s.servers_up == 4 && s.servers_total == sb.servers_total && s.capacity_bytes == sb.capacity_bytes);
    CHECK(s.inodes > 0);
    CHECK(shoal_statfs_get_async(c, NULL, NULL, NULL) == NULL && errno == EFAULT);

    /* opendir: a listing to read and close, or -ENOTDIR / -ENOENT. */
    shoal_dir *d = NULL;
    CHECK(result_of(shoal_opendir_async(c, "/ma", &d, NULL, NULL)) == 0 && d != NULL);
    int seen_f = 0, seen_ln = 0, others = 0;
    const shoal_dirent *e;
    while ((e = shoal_readdir(d)) != NULL) {
        if (strcmp(e->name, "f") == 0 && e->kind == SHOAL_DT_REG) {
            seen_f++;
        } else if (strcmp(e->name, "ln") == 0 && e->kind == SHOAL_DT_LNK) {
            seen_ln++;
        } else {
            others++;
        }
    }
    CHECK(seen_f == 1 && seen_ln == 1 && others == 0 && shoal_closedir(d) == 0);
    d = NULL;
    CHECK(result_of(shoal_opendir_async(c, "/ma/f", &d, NULL, NULL)) == -ENOTDIR && d == NULL);
    CHECK(result_of(shoal_opendir_async(c, "/nope", &d, NULL, NULL)) == -ENOENT && d == NULL);
    CHECK(shoal_opendir_async(c, "/ma", NULL, NULL, NULL) == NULL && errno == EFAULT);

    shoal_disconnect(c);
    puts("ok");
    return 0;
}
