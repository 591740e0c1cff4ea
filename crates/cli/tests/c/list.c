/* libshoal list I/O from C against real servers: 10,000 strided 4 KiB extents written from
 * one buffer and read back into many segments, blocking and asynchronous, with the
 * argument errors. Run by c_api.rs with the cluster's configuration as argv[1]. */
#include <shoal.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define N 10000
#define PIECE 4096
#define STRIDE 8192

static unsigned char byte_at(uint64_t file_offset) { return (unsigned char)(file_offset * 7 + 3); }

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);
    shoal_file *f = shoal_open(c, "/strided", O_CREAT | O_RDWR, 0644);
    CHECK(f != NULL);

    /* One memory segment, 10,000 file extents. */
    unsigned char *src = malloc((size_t)N * PIECE);
    shoal_extent *ext = malloc(N * sizeof *ext);
    CHECK(src && ext);
    for (int i = 0; i < N; i++) {
        ext[i].offset = (uint64_t)i * STRIDE;
        ext[i].len = PIECE;
        for (int b = 0; b < PIECE; b++) src[(size_t)i * PIECE + b] = byte_at(ext[i].offset + b);
    }
    shoal_segment one = {src, (size_t)N * PIECE};
    CHECK(shoal_write_list(f, &one, 1, ext, N) == (int64_t)N * PIECE);
    CHECK(shoal_fsync(f) == 0);

    /* Back into 3 segments of odd sizes (including an empty one), blocking. */
    size_t total = (size_t)N * PIECE;
    unsigned char *dst = calloc(1, total);
    CHECK(dst != NULL);
    shoal_segment three[4] = {{dst, 1000}, {dst + 1000, 0}, {dst + 1000, total - 5000}, {dst + total - 4000, 4000}};
    CHECK(shoal_read_list(f, three, 4, ext, N) == (int64_t)total);
    CHECK(memcmp(src, dst, total) == 0);

    /* Asynchronously, with a hole and an extent past the end of the file. */
    memset(dst, 0xEE, total);
    shoal_extent tail[2] = {{PIECE, 10}, {(uint64_t)N * STRIDE, 100}};
    shoal_segment into = {dst, 110};
    shoal_future *fut = shoal_read_list_async(f, &into, 1, tail, 2, NULL, NULL);
    CHECK(fut != NULL);
    int64_t r = 0;
    CHECK(shoal_future_wait(fut, &r) == 0 && r == 10);
    shoal_future_free(fut);
    for (int b = 0; b < 10; b++) CHECK(dst[b] == 0);       /* the hole between extents */
    for (int b = 10; b < 110; b++) CHECK(dst[b] == 0xEE);  /* past the end: untouched */

    shoal_extent over = {3, 2};
    char xy_bytes[] = "XY";
    shoal_segment xy = {xy_bytes, 2};
    fut = shoal_write_list_async(f, &xy, 1, &over, 1, NULL, NULL);
    CHECK(fut != NULL && shoal_future_wait(fut, &r) == 0 && r == 2);
    shoal_future_free(fut);
    unsigned char four[4];
    CHECK(shoal_pread(f, four, 4, 2) == 4 && four[1] == 'X' && four[2] == 'Y');

    /* Errors: totals that differ, NULL lists. */
    shoal_segment short_seg = {dst, 5};
    CHECK(shoal_read_list(f, &short_seg, 1, ext, 1) == -1 && errno == EINVAL);
    CHECK(shoal_write_list(f, NULL, 1, ext, 1) == -1 && errno == EFAULT);
    CHECK(shoal_read_list_async(f, &short_seg, 1, ext, 1, NULL, NULL) == NULL && errno == EINVAL);

    CHECK(shoal_close(f) == 0);
    shoal_disconnect(c);
    free(src);
    free(dst);
    free(ext);
    printf("ok\n");
    return 0;
}
