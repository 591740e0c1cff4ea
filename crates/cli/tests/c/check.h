/* CHECK(cond) for the C test programs: on failure, name the check, errno and libshoal's
 * message, and exit 1. */
#ifndef SHOAL_TEST_CHECK_H
#define SHOAL_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d: %s)\n", __FILE__, __LINE__, \
                    #cond, errno, shoal_last_error());                                   \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#endif
