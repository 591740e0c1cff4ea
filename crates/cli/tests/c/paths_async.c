/* libshoal's asynchronous calls on paths from C against real servers: 100 creates in
 * flight at once, then stats, renames and unlinks as futures, with their errors as -errno
 * results. Run by c_api.rs with the cluster's configuration as argv[1]. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

#define N 100

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    shoal_future *mk = shoal_mkdir_async(c, "/a", 0755, NULL, NULL);
    int64_t r = -1;
    CHECK(mk != NULL && shoal_future_wait(mk, &r) == 0 && r == 0);
    shoal_future_free(mk);

    char path[N][32], moved[N][32];
    shoal_file *files[N];
    shoal_future *futs[N];
    for (int i = 0; i < N; i++) {
        snprintf(path[i], sizeof path[i], "/a/f%d", i);
        snprintf(moved[i], sizeof moved[i], "/a/g%d", i);
        futs[i] = shoal_open_async(c, path[i], O_CREAT | O_EXCL | O_RDWR, 0640, &files[i], NULL, NULL);
        CHECK(futs[i] != NULL);
    }
    CHECK(shoal_future_wait_all((const shoal_future *const *)futs, N) == 0);
    for (int i = 0; i < N; i++) {
        CHECK(shoal_future_test(futs[i], &r) == 1 && r == 0);
        shoal_future_free(futs[i]);
        CHECK(shoal_pwrite(files[i], "x", 1, (uint64_t)i) == 1);
        CHECK(shoal_close(files[i]) == 0);
    }

    shoal_attr attrs[N];
    for (int i = 0; i < N; i++) futs[i] = shoal_stat_async(c, path[i], &attrs[i], NULL, NULL);
    CHECK(shoal_future_wait_all((const shoal_future *const *)futs, N) == 0);
    for (int i = 0; i < N; i++) {
        CHECK(shoal_future_wait(futs[i], &r) == 0 && r == 0);
        CHECK(S_ISREG(attrs[i].mode) && (attrs[i].mode & 07777) == 0640 && attrs[i].size == (uint64_t)i + 1);
        shoal_future_free(futs[i]);
    }

    for (int i = 0; i < N; i++) futs[i] = shoal_rename_async(c, path[i], moved[i], NULL, NULL);
    CHECK(shoal_future_wait_all((const shoal_future *const *)futs, N) == 0);
    for (int i = 0; i < N; i++) shoal_future_free(futs[i]);
    for (int i = 0; i < N; i++) futs[i] = shoal_unlink_async(c, moved[i], NULL, NULL);
    CHECK(shoal_future_wait_all((const shoal_future *const *)futs, N) == 0);
    for (int i = 0; i < N; i++) {
        CHECK(shoal_future_wait(futs[i], &r) == 0 && r == 0);
        shoal_future_free(futs[i]);
    }

    /* Errors come back as -errno results; bad arguments as NULL with errno. */
    shoal_attr a;
    shoal_future *f = shoal_stat_async(c, "/a/f0", &a, NULL, NULL);
    CHECK(f != NULL && shoal_future_wait(f, &r) == 0 && r == -ENOENT);
    shoal_future_free(f);
    f = shoal_rmdir_async(c, "/", NULL, NULL);
    CHECK(f != NULL && shoal_future_wait(f, &r) == 0 && r < 0);
    shoal_future_free(f);
    CHECK(shoal_stat_async(c, "/a", NULL, NULL, NULL) == NULL && errno == EFAULT);
    CHECK(shoal_open_async(c, "/a/x", 077, 0, &files[0], NULL, NULL) == NULL && errno == EINVAL);
    CHECK(shoal_symlink_async(c, "t", NULL, NULL, NULL) == NULL && errno == EFAULT);

    f = shoal_rmdir_async(c, "/a", NULL, NULL);
    CHECK(f != NULL && shoal_future_wait(f, &r) == 0 && r == 0);
    shoal_future_free(f);
    shoal_disconnect(c);
    printf("ok\n");
    return 0;
}
