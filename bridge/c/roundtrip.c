/*
 * roundtrip.c - an engine other than vLLM embedding the PegaFlow-JVM store in-process:
 * start a JVM, fetch the pegaflow_api table, save two layers of four blocks, query them,
 * load them into other block ids, check every byte and an untouched control block, and
 * check that bad input comes back as an error code with a message.
 *
 *   cc -I$JAVA_HOME/include -I$JAVA_HOME/include/linux -Ibridge/include bridge/c/roundtrip.c \
 *      -L$JAVA_HOME/lib/server -ljvm -Wl,-rpath,$JAVA_HOME/lib/server -o roundtrip
 *   ./roundtrip path/to/pegaflow.jar
 */
#include <jni.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pegaflow.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        int32_t rc_ = (call);                                                        \
        if (rc_ != PF_OK) {                                                          \
            char msg_[1024];                                                         \
            api->last_error(msg_, sizeof msg_);                                      \
            fprintf(stderr, "%s:%d %s failed: code %d: %s\n", __FILE__, __LINE__,     \
                    #call, rc_, msg_);                                               \
            return 1;                                                                \
        }                                                                            \
    } while (0)

enum { LAYERS = 2, BLOCKS = 16, SEG = 4096, SAVED = 4 };

static const pegaflow_api *start(const char *jar, JavaVM **vm) {
    char classpath[4096];
    snprintf(classpath, sizeof classpath, "-Djava.class.path=%s", jar);
    JavaVMOption options[] = {
        {.optionString = classpath},
        {.optionString = "-Xrs"},
        {.optionString = "-Xmx256m"},
        {.optionString = "--enable-native-access=ALL-UNNAMED"},
        {.optionString = "-XX:ErrorFile=/tmp/pegaflow-roundtrip-hs_err_%p.log"},
    };
    JavaVMInitArgs args = {.version = JNI_VERSION_10, .nOptions = 5, .options = options,
                           .ignoreUnrecognized = JNI_FALSE};
    JNIEnv *env;
    if (JNI_CreateJavaVM(vm, (void **) &env, &args) != JNI_OK) {
        fprintf(stderr, "JNI_CreateJavaVM failed\n");
        return NULL;
    }
    jclass cls = (*env)->FindClass(env, PEGAFLOW_BOOTSTRAP_CLASS);
    jmethodID boot = cls ? (*env)->GetStaticMethodID(env, cls, PEGAFLOW_BOOTSTRAP_METHOD,
                                                     PEGAFLOW_BOOTSTRAP_SIGNATURE) : NULL;
    jlong table = boot ? (*env)->CallStaticLongMethod(env, cls, boot) : 0;
    if ((*env)->ExceptionCheck(env) || table == 0) {
        (*env)->ExceptionDescribe(env);
        fprintf(stderr, "bootstrap of %s failed\n", PEGAFLOW_BOOTSTRAP_CLASS);
        return NULL;
    }
    return (const pegaflow_api *) (intptr_t) table;
}

static uint8_t pattern(int block, int layer, int seg, int i) {
    return (uint8_t) (block * 31 + layer * 7 + seg * 3 + i * 13 + 1);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s path/to/pegaflow.jar\n", argv[0]);
        return 2;
    }
    JavaVM *vm;
    const pegaflow_api *api = start(argv[1], &vm);
    if (api == NULL) {
        return 1;
    }
    if (api->abi_version != PEGAFLOW_ABI_VERSION) {
        fprintf(stderr, "ABI version %u, expected %d\n", api->abi_version, PEGAFLOW_ABI_VERSION);
        return 1;
    }

    /* "Device" KV cache in host memory: per layer [2, BLOCKS, SEG] (K of every block, then V). */
    uint8_t *kv[LAYERS];
    int64_t params[LAYERS * PEGAFLOW_LAYER_PARAMS];
    for (int l = 0; l < LAYERS; l++) {
        kv[l] = calloc(2 * BLOCKS, SEG);
        int64_t *p = &params[l * PEGAFLOW_LAYER_PARAMS];
        p[0] = PF_SPLIT_KV;
        p[1] = (int64_t) (intptr_t) kv[l];
        p[2] = 2L * BLOCKS * SEG;
        p[3] = BLOCKS;
        p[4] = SEG;
        p[5] = SEG;
        p[6] = (int64_t) BLOCKS * SEG;
        for (int b = 0; b < SAVED; b++)
            for (int s = 0; s < 2; s++)
                for (int i = 0; i < SEG; i++)
                    kv[l][(s * BLOCKS + b) * SEG + i] = pattern(b, l, s, i);
    }
    memset(kv[0] + 9 * SEG, 0x5A, SEG); /* control block 9, K of layer 0 */

    int64_t engine;
    CHECK(api->engine_create("64mb", 1, 0, 0, 0, 0, "", &engine)); /* "": no SSD tier */
    CHECK(api->register_instance(engine, "c-host", "c-namespace", 1, 1));
    CHECK(api->register_worker(engine, "c-host", 0, 0, 0, LAYERS, "layers.0.attn\nlayers.1.attn", params));

    int64_t src[SAVED] = {0, 1, 2, 3}, dst[SAVED] = {12, 5, 14, 7};
    uint8_t hashes[SAVED * 32];
    for (int i = 0; i < SAVED * 32; i++) hashes[i] = (uint8_t) (i * 37 + 11);
    int64_t done, values[3];
    CHECK(api->save(engine, "c-host", 0, SAVED, src, hashes, 32, NULL, 0, &done));
    CHECK(api->wait(done, -1, values));
    CHECK(api->completion_free(done));
    printf("saved %lld blocks (%lld bytes)\n", (long long) values[0], (long long) values[2]);

    int32_t hit[2]; /* resident prefix, and blocks still being read back from SSD */
    uint8_t lease[PEGAFLOW_LEASE_BYTES];
    CHECK(api->query(engine, "c-host", SAVED, hashes, 32, hit, lease));
    if (hit[0] != SAVED || hit[1] != 0) {
        fprintf(stderr, "query hit %d (pending %d), expected %d\n", hit[0], hit[1], SAVED);
        return 1;
    }
    CHECK(api->load(engine, "c-host", 0, lease, SAVED, dst, &done));
    CHECK(api->wait(done, 10000, values));
    CHECK(api->completion_free(done));
    printf("loaded %lld blocks into other block ids\n", (long long) values[0]);

    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < SAVED; k++)
            for (int s = 0; s < 2; s++)
                for (int i = 0; i < SEG; i++)
                    if (kv[l][(s * BLOCKS + dst[k]) * SEG + i] != pattern((int) src[k], l, s, i)) {
                        fprintf(stderr, "byte mismatch: layer %d block %lld seg %d offset %d\n", l,
                                (long long) dst[k], s, i);
                        return 1;
                    }
    for (int i = 0; i < SEG; i++)
        if (kv[0][9 * SEG + i] != 0x5A) {
            fprintf(stderr, "control block 9 was touched\n");
            return 1;
        }

    /* Bad input: an error code and a message naming the value; the engine carries on. */
    char msg[512];
    int32_t rc = api->query(engine, "no-such-instance", SAVED, hashes, 32, hit, lease);
    api->last_error(msg, sizeof msg);
    if (rc != PF_UNKNOWN_INSTANCE || strstr(msg, "no-such-instance") == NULL) {
        fprintf(stderr, "bad input gave code %d, message '%s'\n", rc, msg);
        return 1;
    }
    printf("bad input: code %d: %s\n", rc, msg);

    char stats[4096];
    int32_t len;
    CHECK(api->stats(engine, stats, sizeof stats, &len));
    printf("stats: %.200s...\n", stats);
    CHECK(api->engine_close(engine));
    CHECK(api->shutdown());
    (*vm)->DestroyJavaVM(vm);
    printf("roundtrip ok\n");
    return 0;
}
