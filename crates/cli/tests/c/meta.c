/* libshoal from C against real servers: listings, links, attributes, extended attributes
 * and statfs, with their errors. Run by c_api.rs with the cluster's configuration as
 * argv[1]; prints "ok" and exits 0, or names the failed check. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "check.h"

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    CHECK(shoal_mkdir(c, "/m", 0755) == 0);

    /* A listing of 100 files, each seen once with its kind. */
    char path[64];
    for (int i = 0; i < 100; i++) {
        snprintf(path, sizeof path, "/m/f%d", i);
        shoal_file *f = shoal_open(c, path, O_CREAT | O_WRONLY | O_EXCL, 0644);
        CHECK(f != NULL);
        CHECK(shoal_close(f) == 0);
    }
    CHECK(shoal_mkdir(c, "/m/sub", 0700) == 0);
    char seen[100] = {0};
    int files = 0, dirs = 0;
    shoal_dir *d = shoal_opendir(c, "/m");
    CHECK(d != NULL);
    const shoal_dirent *e;
    while ((e = shoal_readdir(d)) != NULL) {
        if (e->kind == SHOAL_DT_DIR) {
            CHECK(strcmp(e->name, "sub") == 0);
            dirs++;
            continue;
        }
        int i = -1;
        CHECK(e->kind == SHOAL_DT_REG && sscanf(e->name, "f%d", &i) == 1 && i >= 0 && i < 100 && !seen[i]);
        seen[i] = 1;
        files++;
    }
    CHECK(files == 100 && dirs == 1);
    CHECK(shoal_closedir(d) == 0);
    CHECK(shoal_opendir(c, "/m/f1") == NULL && errno == ENOTDIR);
    CHECK(shoal_opendir(c, "/nope") == NULL && errno == ENOENT);

    /* Symbolic links: readlink's length, ERANGE, lstat against stat. */
    CHECK(shoal_symlink(c, "/m/f1", "/m/link") == 0);
    char target[64];
    CHECK(shoal_readlink(c, "/m/link", NULL, 0) == 5);
    CHECK(shoal_readlink(c, "/m/link", target, 3) == -1 && errno == ERANGE);
    memset(target, 0, sizeof target);
    CHECK(shoal_readlink(c, "/m/link", target, sizeof target) == 5 && strcmp(target, "/m/f1") == 0);
    shoal_attr a, b;
    CHECK(shoal_lstat(c, "/m/link", &a) == 0 && S_ISLNK(a.mode));
    CHECK(shoal_stat(c, "/m/link", &b) == 0 && S_ISREG(b.mode));
    CHECK(shoal_readlink(c, "/m/f1", target, sizeof target) == -1 && errno == EINVAL);

    /* Hard links, attributes. */
    CHECK(shoal_link(c, "/m/f2", "/m/f2-again") == 0);
    CHECK(shoal_stat(c, "/m/f2", &a) == 0 && a.nlink == 2);
    CHECK(shoal_chmod(c, "/m/f2", 0600) == 0);
    CHECK(shoal_stat(c, "/m/f2-again", &a) == 0 && (a.mode & 07777) == 0600);
    CHECK(shoal_chown(c, "/m/f2", 1234, (uint32_t)-1) == 0);
    CHECK(shoal_stat(c, "/m/f2", &b) == 0 && b.uid == 1234 && b.gid == a.gid);
    shoal_time times[2] = {{1000000000, 5}, {1200000000, SHOAL_UTIME_OMIT}};
    CHECK(shoal_stat(c, "/m/f3", &a) == 0);
    CHECK(shoal_utimens(c, "/m/f3", times) == 0);
    CHECK(shoal_stat(c, "/m/f3", &b) == 0 && b.atime_sec == 1000000000 && b.atime_nsec == 5);
    CHECK(b.mtime_sec == a.mtime_sec && b.mtime_nsec == a.mtime_nsec);
    shoal_time bad[2] = {{0, 2000000000}, {0, 0}};
    CHECK(shoal_utimens(c, "/m/f3", bad) == -1 && errno == EINVAL);
    CHECK(shoal_truncate(c, "/m/f3", 12345) == 0);
    CHECK(shoal_stat(c, "/m/f3", &a) == 0 && a.size == 12345);

    /* Extended attributes. */
    CHECK(shoal_setxattr(c, "/m/f4", "user.a", "hello", 5, 0) == 0);
    CHECK(shoal_setxattr(c, "/m/f4", "user.a", "x", 1, XATTR_CREATE) == -1 && errno == EEXIST);
    CHECK(shoal_setxattr(c, "/m/f4", "user.b", "x", 1, XATTR_REPLACE) == -1 && errno == ENODATA);
    CHECK(shoal_setxattr(c, "/m/f4", "user.b", "", 0, 0) == 0);
    char value[16] = {0};
    CHECK(shoal_getxattr(c, "/m/f4", "user.a", NULL, 0) == 5);
    CHECK(shoal_getxattr(c, "/m/f4", "user.a", value, 2) == -1 && errno == ERANGE);
    CHECK(shoal_getxattr(c, "/m/f4", "user.a", value, sizeof value) == 5 && memcmp(value, "hello", 5) == 0);
    CHECK(shoal_getxattr(c, "/m/f4", "user.none", value, sizeof value) == -1 && errno == ENODATA);
    char names[64];
    ssize_t n = shoal_listxattr(c, "/m/f4", names, sizeof names);
    CHECK(n == 14); /* "user.a\0user.b\0" in some order */
    CHECK((strcmp(names, "user.a") == 0 && strcmp(names + 7, "user.b") == 0) ||
          (strcmp(names, "user.b") == 0 && strcmp(names + 7, "user.a") == 0));
    CHECK(shoal_removexattr(c, "/m/f4", "user.a") == 0);
    CHECK(shoal_removexattr(c, "/m/f4", "user.a") == -1 && errno == ENODATA);

    /* The cluster. */
    shoal_statfs s;
    CHECK(shoal_statfs_get(c, &s) == 0 && s.servers_up == 4 && s.capacity_bytes >= s.free_bytes && s.inodes > 100);

    shoal_disconnect(c);
    puts("ok");
    return 0;
}
