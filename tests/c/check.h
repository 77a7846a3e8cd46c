/* check.h — a minimal assertion harness for the standalone C tests.
 * CHECK(cond, fmt, ...) records a failure and goes on; each test program
 * ends with `return check_report("name");`, which prints "N passed, N failed"
 * and returns nonzero when anything failed. */
#ifndef FP8MIX_CHECK_H
#define FP8MIX_CHECK_H
#include <stdio.h>

static long check_pass_, check_fail_;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            check_pass_++;                                                  \
        } else {                                                            \
            if (check_fail_ < 20) {                                         \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__,      \
                        __LINE__, #cond);                                   \
                fprintf(stderr, __VA_ARGS__);                               \
                fputc('\n', stderr);                                        \
            }                                                               \
            check_fail_++;                                                  \
        }                                                                   \
    } while (0)

static inline int check_report(const char *name)
{
    printf("%s: %ld passed, %ld failed\n", name, check_pass_, check_fail_);
    return check_fail_ != 0;
}
#endif
