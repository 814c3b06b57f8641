/*
 * pegaflow_check.h - the checks the native example programs share (bridge/c/roundtrip.c,
 * bridge/cuda/native_kv.cu): a call into the table must return PF_OK, else its code and this
 * thread's last_error are printed and the program exits 1; a condition must hold, else the
 * message. The including file defines `api`, the pegaflow_api table, before using them.
 */
#ifndef PEGAFLOW_CHECK_H
#define PEGAFLOW_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pegaflow.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        int32_t rc_ = (call);                                                        \
        if (rc_ != PF_OK) {                                                          \
            char msg_[2048];                                                         \
            api->last_error(msg_, sizeof msg_);                                      \
            fprintf(stderr, "%s:%d %s failed: code %d: %s\n", __FILE__, __LINE__,     \
                    #call, rc_, msg_);                                               \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#define EXPECT(cond, ...)                                                            \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d expected %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* A bad call: the expected code, and a message containing `needle`; printed as "bad call". */
#define EXPECT_ERROR(call, code, needle)                                             \
    do {                                                                             \
        int32_t rc_ = (call);                                                        \
        char msg_[1024];                                                             \
        api->last_error(msg_, sizeof msg_);                                          \
        EXPECT(rc_ == (code) && strstr(msg_, (needle)) != NULL,                      \
               "%s gave code %d, message '%s'", #call, rc_, msg_);                   \
        printf("bad call %-16s code %2d: %.110s\n", #code, rc_, msg_);                \
    } while (0)

#endif /* PEGAFLOW_CHECK_H */
