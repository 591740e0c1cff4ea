/* libshoal from C against real servers: the tuple space (docs/tuples.md). Tuples and
 * templates built field by field, written, read (oldest, newest) and taken with timeouts,
 * their fields read back, a take waiting in another thread, watches resumed from a cursor,
 * and the errors. Run by c_api.rs with the cluster's configuration as argv[1]; prints "ok"
 * and exits 0, or names the failed check. */
#include <shoal.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ("cjob", n, s) */
static shoal_tuple *job(int64_t n, const char *s) {
    shoal_tuple *t = shoal_tuple_new();
    CHECK(t != NULL);
    CHECK(shoal_tuple_add_str(t, "cjob") == 0);
    CHECK(shoal_tuple_add_int(t, n) == 0);
    CHECK(shoal_tuple_add_str(t, s) == 0);
    return t;
}

static void write_free(shoal_client *c, shoal_tuple *t) {
    CHECK(shoal_tuple_write(c, t) > 0);
    CHECK(shoal_tuple_free(t) == 0);
}

/* A template whose first field is the string `first`. */
static shoal_template *tmpl(const char *first) {
    shoal_template *t = shoal_template_new();
    CHECK(t != NULL);
    CHECK(shoal_template_add_str(t, first) == 0);
    return t;
}

/* Is `t` ("cjob", n, s)? */
static int is_job(const shoal_tuple *t, int64_t n, const char *s) {
    int64_t got;
    size_t len;
    return t != NULL && shoal_tuple_count(t) == 3 && shoal_tuple_type(t, 1) == SHOAL_TUPLE_INT &&
           shoal_tuple_get_int(t, 1, &got) == 0 && got == n && shoal_tuple_type(t, 2) == SHOAL_TUPLE_STR &&
           strcmp(shoal_tuple_get_str(t, 2, &len), s) == 0 && len == strlen(s);
}

struct taker {
    shoal_client *c;
    int rc;
    shoal_tuple *got;
};

static void *take_forever(void *arg) {
    struct taker *tk = arg;
    shoal_template *q = tmpl("cqueue");
    CHECK(shoal_template_add_any(q) == 0);
    tk->rc = shoal_tuple_take(tk->c, q, SHOAL_WAIT_FOREVER, &tk->got);
    CHECK(shoal_template_free(q) == 0);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    shoal_client *c = shoal_connect(argv[1]);
    CHECK(c != NULL);

    /* Writes: event numbers grow on the server of "cjob". */
    shoal_tuple *t = job(1, "one");
    int64_t first = shoal_tuple_write(c, t);
    CHECK(first > 0 && shoal_tuple_free(t) == 0);
    t = job(2, "two");
    CHECK(shoal_tuple_write(c, t) > first && shoal_tuple_free(t) == 0);
    /* ("cjob", bytes 00 ff 7f) */
    const unsigned char raw[3] = {0x00, 0xff, 0x7f};
    t = shoal_tuple_new();
    CHECK(shoal_tuple_add_str(t, "cjob") == 0 && shoal_tuple_add_bytes(t, raw, sizeof raw) == 0);
    write_free(c, t);

    /* Read the oldest with typed wildcards, and the newest; a read leaves the tuple. */
    shoal_template *q = tmpl("cjob");
    CHECK(shoal_template_add_any_of(q, SHOAL_TUPLE_INT) == 0 && shoal_template_add_any(q) == 0);
    shoal_tuple *got = NULL;
    CHECK(shoal_tuple_read(c, q, 0, &got) == 1 && is_job(got, 1, "one"));
    CHECK(shoal_tuple_free(got) == 0);
    CHECK(shoal_tuple_read(c, q, 0, &got) == 1 && is_job(got, 1, "one"));
    CHECK(shoal_tuple_free(got) == 0);
    CHECK(shoal_tuple_read_newest(c, q, 0, &got) == 1 && is_job(got, 2, "two"));
    CHECK(shoal_tuple_free(got) == 0);

    /* Exact values; a string "2" is not the integer 2; arity counts. */
    shoal_template *exact = tmpl("cjob");
    CHECK(shoal_template_add_int(exact, 2) == 0 && shoal_template_add_str(exact, "two") == 0);
    CHECK(shoal_tuple_read(c, exact, 0, &got) == 1 && is_job(got, 2, "two"));
    CHECK(shoal_tuple_free(got) == 0 && shoal_template_free(exact) == 0);
    exact = tmpl("cjob");
    CHECK(shoal_template_add_str(exact, "2") == 0 && shoal_template_add_any(exact) == 0);
    got = (shoal_tuple *)1;
    CHECK(shoal_tuple_read(c, exact, 0, &got) == 0 && got == NULL);
    CHECK(shoal_template_free(exact) == 0);

    /* Bytes: read back by type and by value; fields of the wrong type are EINVAL. */
    shoal_template *qb = tmpl("cjob");
    CHECK(shoal_template_add_any_of(qb, SHOAL_TUPLE_BYTES) == 0);
    CHECK(shoal_tuple_read(c, qb, 0, &got) == 1 && shoal_tuple_count(got) == 2);
    size_t len = 0;
    const void *b = shoal_tuple_get_bytes(got, 1, &len);
    CHECK(b != NULL && len == 3 && memcmp(b, raw, 3) == 0 && shoal_tuple_type(got, 1) == SHOAL_TUPLE_BYTES);
    int64_t n;
    CHECK(shoal_tuple_get_int(got, 1, &n) == -1 && errno == EINVAL && strstr(shoal_last_error(), "not an integer"));
    CHECK(shoal_tuple_get_str(got, 1, NULL) == NULL && errno == EINVAL);
    CHECK(shoal_tuple_get_bytes(got, 0, &len) == NULL && errno == EINVAL);
    CHECK(shoal_tuple_type(got, 2) == -1 && errno == EINVAL);
    CHECK(strcmp(shoal_tuple_get_str(got, 0, NULL), "cjob") == 0);
    CHECK(shoal_tuple_free(got) == 0 && shoal_template_free(qb) == 0);
    qb = tmpl("cjob");
    CHECK(shoal_template_add_bytes(qb, raw, sizeof raw) == 0);
    CHECK(shoal_tuple_take(c, qb, 0, &got) == 1 && shoal_tuple_count(got) == 2 && shoal_tuple_free(got) == 0);
    CHECK(shoal_tuple_read(c, qb, 0, &got) == 0 && shoal_template_free(qb) == 0);
    /* ("cempty", empty bytes): a field of 0 bytes is not NULL. */
    t = shoal_tuple_new();
    CHECK(shoal_tuple_add_str(t, "cempty") == 0 && shoal_tuple_add_bytes(t, NULL, 0) == 0);
    write_free(c, t);
    qb = tmpl("cempty");
    CHECK(shoal_template_add_bytes(qb, "", 0) == 0);
    CHECK(shoal_tuple_take(c, qb, 0, &got) == 1);
    len = 99;
    CHECK(shoal_tuple_get_bytes(got, 1, &len) != NULL && len == 0);
    CHECK(shoal_tuple_free(got) == 0 && shoal_template_free(qb) == 0);

    /* Takes remove, oldest first; then a timeout of 300 ms is waited and answers 0. */
    CHECK(shoal_tuple_take(c, q, 0, &got) == 1 && is_job(got, 1, "one") && shoal_tuple_free(got) == 0);
    CHECK(shoal_tuple_take(c, q, 0, &got) == 1 && is_job(got, 2, "two") && shoal_tuple_free(got) == 0);
    double t0 = now_ms();
    CHECK(shoal_tuple_take(c, q, 300, &got) == 0 && got == NULL);
    CHECK(now_ms() - t0 >= 290);

    /* A take waiting forever in another thread gets a tuple written later. */
    struct taker tk = {c, -2, NULL};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, take_forever, &tk) == 0);
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
    t = shoal_tuple_new();
    CHECK(shoal_tuple_add_str(t, "cqueue") == 0 && shoal_tuple_add_str(t, "work") == 0);
    write_free(c, t);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(tk.rc == 1 && shoal_tuple_count(tk.got) == 2 && strcmp(shoal_tuple_get_str(tk.got, 1, NULL), "work") == 0);
    CHECK(shoal_tuple_free(tk.got) == 0);

    /* A watch from now: written and taken events of matching tuples, in order. */
    shoal_template *wq = tmpl("cwatch");
    CHECK(shoal_template_add_any_of(wq, SHOAL_TUPLE_INT) == 0);
    shoal_tuple_watcher *w = shoal_tuple_watch(c, wq, SHOAL_WATCH_WRITTEN | SHOAL_WATCH_TAKEN, SHOAL_WATCH_NOW);
    CHECK(w != NULL);
    shoal_tuple_event ev;
    CHECK(shoal_tuple_watch_next(w, 100, &ev) == 0);
    for (int64_t i = 1; i <= 2; i++) {
        t = shoal_tuple_new();
        CHECK(shoal_tuple_add_str(t, "cwatch") == 0 && shoal_tuple_add_int(t, i) == 0);
        write_free(c, t);
    }
    t = shoal_tuple_new();
    CHECK(shoal_tuple_add_str(t, "cwatch") == 0 && shoal_tuple_add_str(t, "not a number") == 0);
    write_free(c, t);
    CHECK(shoal_tuple_take(c, wq, 0, &got) == 1 && shoal_tuple_free(got) == 0);
    int64_t expect[3][2] = {{SHOAL_WATCH_WRITTEN, 1}, {SHOAL_WATCH_WRITTEN, 2}, {SHOAL_WATCH_TAKEN, 1}};
    uint64_t last_seq = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(shoal_tuple_watch_next(w, 10000, &ev) == 1);
        CHECK(ev.kind == expect[i][0] && ev.seq > last_seq && ev.at_sec > 0);
        CHECK(shoal_tuple_count(ev.tuple) == 2 && shoal_tuple_get_int(ev.tuple, 1, &n) == 0 && n == expect[i][1]);
        last_seq = ev.seq;
    }
    CHECK(shoal_tuple_watch_next(w, 100, &ev) == 0);
    int64_t cursor = shoal_tuple_watch_cursor(w);
    CHECK(cursor >= (int64_t)last_seq && shoal_tuple_watch_lost(w) == 0);
    CHECK(shoal_tuple_watch_free(w) == 0);

    /* Resumed from the cursor: exactly the events after it, none repeated. */
    for (int64_t i = 3; i <= 4; i++) {
        t = shoal_tuple_new();
        CHECK(shoal_tuple_add_str(t, "cwatch") == 0 && shoal_tuple_add_int(t, i) == 0);
        write_free(c, t);
    }
    w = shoal_tuple_watch(c, wq, SHOAL_WATCH_WRITTEN, cursor);
    CHECK(w != NULL);
    CHECK(shoal_tuple_watch_next(w, 10000, &ev) == 1 && shoal_tuple_get_int(ev.tuple, 1, &n) == 0 && n == 3);
    CHECK(shoal_tuple_watch_next(w, 10000, &ev) == 1 && shoal_tuple_get_int(ev.tuple, 1, &n) == 0 && n == 4);
    CHECK(ev.kind == SHOAL_WATCH_WRITTEN);
    CHECK(shoal_tuple_watch_next(w, 200, &ev) == 0);
    CHECK(shoal_tuple_watch_free(w) == 0);

    /* Errors: a wildcard first field, an empty tuple, bad timeouts, kinds, after, NULLs. */
    shoal_template *bad = shoal_template_new();
    CHECK(shoal_template_add_any(bad) == 0);
    CHECK(shoal_tuple_read(c, bad, 0, &got) == -1 && errno == EINVAL &&
          strstr(shoal_last_error(), "first field") != NULL);
    CHECK(shoal_template_add_any_of(bad, 42) == -1 && errno == EINVAL);
    CHECK(shoal_template_free(bad) == 0);
    t = shoal_tuple_new();
    CHECK(shoal_tuple_write(c, t) == -1 && errno == EINVAL);
    CHECK(shoal_tuple_free(t) == 0);
    CHECK(shoal_tuple_read(c, q, -2, &got) == -1 && errno == EINVAL);
    CHECK(shoal_tuple_read(c, q, 0, NULL) == -1 && errno == EFAULT);
    CHECK(shoal_tuple_read(c, NULL, 0, &got) == -1 && errno == EFAULT);
    CHECK(shoal_tuple_watch(c, wq, 0, SHOAL_WATCH_NOW) == NULL && errno == EINVAL);
    CHECK(shoal_tuple_watch(c, wq, 4, SHOAL_WATCH_NOW) == NULL && errno == EINVAL);
    CHECK(shoal_tuple_watch(c, wq, SHOAL_WATCH_WRITTEN, -5) == NULL && errno == EINVAL);
    CHECK(shoal_tuple_watch_next(NULL, 0, &ev) == -1 && errno == EFAULT);
    CHECK(shoal_tuple_watch_cursor(NULL) == -1 && errno == EFAULT);
    CHECK(shoal_tuple_add_str(NULL, "x") == -1 && errno == EFAULT);
    t = shoal_tuple_new();
    CHECK(shoal_tuple_add_bytes(t, NULL, 1) == -1 && errno == EFAULT && shoal_tuple_count(t) == 0);
    CHECK(shoal_tuple_free(t) == 0);
    CHECK(shoal_tuple_count(NULL) == 0 && shoal_tuple_free(NULL) == 0 && shoal_template_free(NULL) == 0);
    CHECK(shoal_tuple_watch_free(NULL) == 0);
    CHECK(shoal_template_free(q) == 0 && shoal_template_free(wq) == 0);

    shoal_disconnect(c);
    printf("ok\n");
    return 0;
}
