/* A checkpoint through libshoal_container under MPI, as a SIONlib program would write it
 * (docs/containers-c.md). Run with 4 ranks:
 *
 *   mpirun -np 4 ./checkpoint <container> <serial container> <nfiles> [config]
 *
 * 1. Every rank writes its own data (15 to 30 KiB, more than its 4 KiB chunk) in pieces,
 *    each kept whole in a chunk by shoal_container_ensure_free_space, so its chunks spread
 *    over new blocks; the container is closed collectively.
 * 2. The 4 ranks open it again, read their data back in pieces of other sizes and check
 *    every byte, seek, and see errors; two groups of 2 ranks fail to open it (it holds 4).
 * 3. Rank 0 opens it serially: shoal_container_get_locations and _get_location against the
 *    pieces written, every rank's data, shoal_container_open_rank; it also writes a
 *    container of 3 tasks serially and reads it back.
 *
 * Container names: a host path, or shoal://path (the cluster of $SHOAL_CONFIG) for the
 * parallel opens; [config], when given, is passed to the serial calls, whose names are then
 * Shoal paths. Prints "ok" on rank 0 and exits 0, or names the failed check and aborts. */
#include <shoal_container_mpi.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FS_BLOCK = 4096, NTASKS = 4, MAXPIECES = 64 };

static int me = -1;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s (errno %d: %s)\n", me, __FILE__, \
                    __LINE__, #cond, errno, shoal_container_last_error());                      \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                       \
        }                                                                                       \
    } while (0)

/* Rank r's chunk size asked for: below one block, so each chunk is one block of 4 KiB. */
static uint64_t chunk_asked(int r) { return 3000 + 100 * (uint64_t)r; }

/* Rank r's pieces: 6 + 2r of them, each of 2100 to 2999 bytes (at most its chunk size and
 * more than half a chunk, so each piece fills a chunk of its own: piece k is in block k). */
static int npieces(int r) { return 6 + 2 * r; }
static size_t piece_len(int r, int k) { return 2100 + (size_t)((k * 397 + r * 131) % 900); }

static size_t total_len(int r) {
    size_t n = 0;
    for (int k = 0; k < npieces(r); k++) n += piece_len(r, k);
    return n;
}

/* Byte i of rank r's logical file. */
static unsigned char pattern(int r, size_t i) { return (unsigned char)(i * 131 + (size_t)r * 29 + (i >> 9)); }

static unsigned char *expected(int r) {
    size_t n = total_len(r);
    unsigned char *p = malloc(n);
    CHECK(p != NULL);
    for (size_t i = 0; i < n; i++) p[i] = pattern(r, i);
    return p;
}

/* The physical file of rank r of n in nfiles: contiguous groups by rank. */
static uint32_t file_of(int r, int n, int nfiles) {
    uint32_t f = 0;
    while ((int)f + 1 < nfiles && (uint64_t)(f + 1) * (uint64_t)n / (uint64_t)nfiles <= (uint64_t)r) f++;
    return f;
}

/* Read the rest of h's logical file in pieces of varying size; check it is `want`. */
static void read_check(shoal_container *h, const unsigned char *want, size_t n) {
    unsigned char *got = malloc(n + 4096);
    size_t at = 0, step = 700;
    CHECK(got != NULL);
    while (!shoal_container_feof(h)) {
        size_t r = shoal_container_fread(got + at, 1, step, h);
        CHECK(r > 0 && at + r <= n);
        at += r;
        step = step * 7 % 3001 + 1;
    }
    CHECK(at == n);
    CHECK(memcmp(got, want, n) == 0);
    /* At the end: nothing more, and feof stays. */
    CHECK(shoal_container_fread(got, 1, 10, h) == 0 && shoal_container_feof(h) == 1);
    free(got);
}

static void parallel_write(const char *name, int nfiles) {
    shoal_container *h = shoal_container_paropen_mpi(name, "w", chunk_asked(me), nfiles, FS_BLOCK, MPI_COMM_WORLD, NULL);
    CHECK(h != NULL);
    shoal_container_info info;
    CHECK(shoal_container_get_info(h, &info) == 0);
    CHECK(info.rank == (uint64_t)me && info.ntasks == NTASKS && info.nfiles == (uint32_t)nfiles);
    CHECK(info.file_number == file_of(me, NTASKS, nfiles));
    CHECK(info.chunk_size == FS_BLOCK && info.fs_block == FS_BLOCK && info.writing == 1);
    /* More than a chunk cannot be kept whole: EINVAL, position unchanged. */
    CHECK(shoal_container_ensure_free_space(h, FS_BLOCK + 1) == -1 && errno == EINVAL);
    CHECK(shoal_container_fwrite(NULL, 1, 10, h) == 0 && errno == EFAULT);
    CHECK(shoal_container_fwrite(NULL, 0, 10, h) == 0); /* nothing to write, as fwrite */

    unsigned char *data = expected(me);
    size_t off = 0;
    for (int k = 0; k < npieces(me); k++) {
        size_t len = piece_len(me, k);
        CHECK(shoal_container_ensure_free_space(h, len) == 0);
        CHECK(shoal_container_bytes_avail_in_chunk(h) >= (int64_t)len);
        if (k % 2) {
            CHECK(shoal_container_fwrite(data + off, len, 1, h) == 1); /* one item of len bytes */
        } else {
            CHECK(shoal_container_fwrite(data + off, 1, len, h) == len);
        }
        off += len;
    }
    uint64_t block, pos;
    CHECK(shoal_container_tell(h, &block, &pos) == (int64_t)off);
    CHECK(block == (uint64_t)npieces(me) - 1 && pos == piece_len(me, npieces(me) - 1));
    CHECK(shoal_container_get_info(h, &info) == 0 && info.nchunks == (uint64_t)npieces(me) && info.bytes == off);
    free(data);
    CHECK(shoal_container_parclose(h) == 0);
}

static void parallel_read(const char *name, int nfiles) {
    shoal_container *h = shoal_container_paropen_mpi(name, "r", 0, 0, 0, MPI_COMM_WORLD, NULL);
    CHECK(h != NULL);
    shoal_container_info info;
    CHECK(shoal_container_get_info(h, &info) == 0);
    CHECK(info.rank == (uint64_t)me && info.ntasks == NTASKS && info.nfiles == (uint32_t)nfiles);
    CHECK(info.chunk_size == FS_BLOCK && info.fs_block == FS_BLOCK && info.writing == 0);
    CHECK(info.nchunks == (uint64_t)npieces(me) && info.bytes == total_len(me));
    CHECK(shoal_container_bytes_avail_in_chunk(h) == (int64_t)piece_len(me, 0));
    CHECK(shoal_container_feof(h) == 0);

    unsigned char *want = expected(me);
    size_t n = total_len(me);
    read_check(h, want, n);

    /* Seek: chunk 1 holds piece 1. */
    unsigned char buf[128];
    CHECK(shoal_container_seek(h, 1, 10) == 0);
    CHECK(shoal_container_fread(buf, 1, 100, h) == 100);
    CHECK(memcmp(buf, want + piece_len(me, 0) + 10, 100) == 0);
    CHECK(shoal_container_seek(h, (uint64_t)npieces(me), 0) == -1 && errno == EINVAL);
    CHECK(shoal_container_seek(h, 0, piece_len(me, 0) + 1) == -1 && errno == EINVAL);
    CHECK(shoal_container_seek_logical(h, n - 5) == 0);
    CHECK(shoal_container_fread(buf, 1, 100, h) == 5 && memcmp(buf, want + n - 5, 5) == 0);
    CHECK(shoal_container_feof(h) == 1);
    /* Items: 3 whole items of 2 bytes from the last 7 bytes (the 7th byte read all the same). */
    CHECK(shoal_container_seek_logical(h, n - 7) == 0);
    CHECK(shoal_container_fread(buf, 2, 10, h) == 3 && memcmp(buf, want + n - 7, 7) == 0);
    CHECK(shoal_container_fwrite(buf, 1, 1, h) == 0 && errno == EINVAL);
    CHECK(shoal_container_ensure_free_space(h, 1) == -1 && errno == EINVAL);
    CHECK(shoal_container_close(h) == -1 && errno == EINVAL); /* a parallel handle: parclose */
    free(want);
    CHECK(shoal_container_parclose(h) == 0);

    /* Two groups of 2 tasks: neither can read a container of 4 (every task fails). */
    MPI_Comm half;
    CHECK(MPI_Comm_split(MPI_COMM_WORLD, me / 2, me, &half) == MPI_SUCCESS);
    errno = 0;
    CHECK(shoal_container_paropen_mpi(name, "r", 0, 0, 0, half, NULL) == NULL);
    CHECK(errno != 0 && strstr(shoal_container_last_error(), "holds 4 logical files") != NULL);
    MPI_Comm_free(&half);
    /* Bad arguments fail at once, on every task, before any communication. */
    CHECK(shoal_container_paropen_mpi(name, "a", 1, 1, 0, MPI_COMM_WORLD, NULL) == NULL && errno == EINVAL);
    CHECK(shoal_container_paropen_mpi(NULL, "r", 1, 1, 0, MPI_COMM_WORLD, NULL) == NULL && errno == EFAULT);
    CHECK(shoal_container_paropen_mpi(name, "w", 0, 1, 0, MPI_COMM_WORLD, NULL) == NULL && errno == EINVAL);
    CHECK(shoal_container_paropen(name, "r", 0, 0, 0, NULL, NULL) == NULL && errno == EFAULT);
}

static void serial_read(const char *name, int nfiles, const char *config) {
    shoal_container *s = shoal_container_open(name, config);
    CHECK(s != NULL);
    shoal_container_info info;
    CHECK(shoal_container_get_info(s, &info) == 0);
    CHECK(info.ntasks == NTASKS && info.nfiles == (uint32_t)nfiles && info.rank == 0 && info.fs_block == FS_BLOCK);

    uint64_t ntasks = 0, maxchunks = 0;
    const uint64_t *chunksizes, *blockcount, *blocksizes;
    CHECK(shoal_container_get_locations(s, &ntasks, &maxchunks, &chunksizes, &blockcount, &blocksizes) == 0);
    CHECK(ntasks == NTASKS && maxchunks == (uint64_t)npieces(NTASKS - 1));
    for (int r = 0; r < NTASKS; r++) {
        CHECK(chunksizes[r] == FS_BLOCK && blockcount[r] == (uint64_t)npieces(r));
        for (uint64_t k = 0; k < maxchunks; k++) {
            uint64_t want = k < (uint64_t)npieces(r) ? piece_len(r, (int)k) : 0;
            CHECK(blocksizes[(uint64_t)r * maxchunks + k] == want);
        }
        shoal_container_location loc;
        uint64_t starts[MAXPIECES], used[MAXPIECES];
        CHECK(shoal_container_get_location(s, (uint64_t)r, NULL, NULL, NULL, 0) == npieces(r));
        CHECK(shoal_container_get_location(s, (uint64_t)r, &loc, starts, used, 1) == -1 && errno == ERANGE);
        CHECK(shoal_container_get_location(s, (uint64_t)r, &loc, starts, used, MAXPIECES) == npieces(r));
        CHECK(loc.rank == (uint64_t)r && loc.file_number == file_of(r, NTASKS, nfiles));
        CHECK(loc.chunk_size == FS_BLOCK && loc.nchunks == (uint64_t)npieces(r) && loc.bytes == total_len(r));
        for (int k = 0; k < npieces(r); k++) {
            CHECK(starts[k] % FS_BLOCK == 0 && used[k] == piece_len(r, k));
            CHECK(k == 0 || starts[k] > starts[k - 1]);
        }
        CHECK(shoal_container_select_rank(s, (uint64_t)r) == 0);
        unsigned char *want = expected(r);
        read_check(s, want, total_len(r));
        free(want);
    }
    CHECK(shoal_container_get_location(s, NTASKS, NULL, NULL, NULL, 0) == -1 && errno == EINVAL);
    CHECK(shoal_container_select_rank(s, NTASKS) == -1 && errno == EINVAL);
    CHECK(shoal_container_parclose(s) == -1 && errno == EINVAL); /* a serial handle: close */
    CHECK(shoal_container_close(s) == 0);

    /* One task's logical file, alone. */
    shoal_container *one = shoal_container_open_rank(name, 3, config);
    CHECK(one != NULL);
    CHECK(shoal_container_get_info(one, &info) == 0 && info.rank == 3 && info.bytes == total_len(3));
    CHECK(shoal_container_get_locations(one, NULL, NULL, NULL, NULL, NULL) == -1 && errno == EINVAL);
    unsigned char *want = expected(3);
    read_check(one, want, total_len(3));
    free(want);
    CHECK(shoal_container_close(one) == 0);
    CHECK(shoal_container_open_rank(name, NTASKS, config) == NULL && errno == EINVAL);
    CHECK(shoal_container_open(NULL, config) == NULL && errno == EFAULT);
}

/* A container of 3 tasks written from this one program, pieces interleaved across tasks
 * (each task keeps its position), then read back. */
static void serial_write(const char *name, const char *config) {
    const uint64_t chunks[3] = {1000, 5000, 300};
    CHECK(shoal_container_open_write(name, 3, NULL, 1, FS_BLOCK, config) == NULL && errno == EFAULT);
    shoal_container *w = shoal_container_open_write(name, 3, chunks, 1, FS_BLOCK, config);
    CHECK(w != NULL);
    unsigned char *data[3];
    for (int r = 0; r < 3; r++) data[r] = expected(r);
    for (int half = 0; half < 2; half++) {
        for (int r = 0; r < 3; r++) {
            size_t n = total_len(r) / 2;
            CHECK(shoal_container_select_rank(w, (uint64_t)r) == 0);
            CHECK(shoal_container_fwrite(data[r] + half * n, 1, n, w) == n);
        }
    }
    CHECK(shoal_container_select_rank(w, 3) == -1 && errno == EINVAL);
    CHECK(shoal_container_close(w) == 0);

    shoal_container *s = shoal_container_open(name, config);
    CHECK(s != NULL);
    for (int r = 0; r < 3; r++) {
        CHECK(shoal_container_select_rank(s, (uint64_t)r) == 0);
        read_check(s, data[r], total_len(r) / 2 * 2);
        free(data[r]);
    }
    CHECK(shoal_container_close(s) == 0);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(argc == 4 || argc == 5);
    CHECK(size == NTASKS);
    const char *name = argv[1], *serial_name = argv[2], *config = argc == 5 ? argv[4] : NULL;
    int nfiles = atoi(argv[3]);

    parallel_write(name, nfiles);
    parallel_read(name, nfiles);
    if (me == 0) {
        /* The parallel name may be shoal://…: with a config, the serial calls take it bare. */
        const char *bare = config != NULL && strncmp(name, "shoal://", 8) == 0 ? name + 7 : name;
        serial_read(bare, nfiles, config);
        serial_write(serial_name, config);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) printf("ok\n");
    MPI_Finalize();
    return 0;
}
