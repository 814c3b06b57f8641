/*
 * roundtrip.c - a native inference engine embedding the PegaFlow-JVM store, on host memory:
 * every entry point of the engine's C ABI (pegaflow.h) that such an engine uses.
 *
 *  - the JVM started from C through pegaflow_boot.h (the Python package's rules);
 *  - a page-first paged KV cache (all layers of a block in one page, K|V per layer) plus a
 *    split K/V sidecar arena, registered in one register_rank call; block 0 reserved;
 *  - keys from vLLM's block hash (block_hashes, xxhash_cbor, seed "0");
 *  - save with poll / wait / completion callback, a completion freed before it is done,
 *    flush, query_request (ready, all-or-nothing loading until the rest is saved, a poll with
 *    other hashes refused, cancel), a lease released on an aborted load, load into other
 *    block ids with every byte compared and untouched blocks still zero;
 *  - a second instance registered the classic way (register_instance + register_worker) in
 *    the same namespace finding the blocks by the same hashes;
 *  - pipeline parallel: two stages registering their own layers (register_rank, pp_size 2);
 *  - an SSD tier below a small pool: a prefix evicted to SSD answers "loading", then ready,
 *    and loads byte-exact;
 *  - bad calls with their codes and messages (sizes refused before anything is allocated).
 *
 *   cc -O2 -Wall -I$JAVA_HOME/include -I$JAVA_HOME/include/linux -Ibridge/include \
 *      bridge/c/roundtrip.c -ldl -lpthread -o roundtrip
 *   ./roundtrip bench/target/pegaflow.jar
 * Exit 0 and "roundtrip ok" when everything held; 3 when the JVM could not start (the reason
 * on stderr).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pegaflow.h"
#include "pegaflow_boot.h"

static const pegaflow_api *api; /* before pegaflow_check.h's macros use it */

#include "pegaflow_check.h"

enum {
    LAYERS = 2,     /* layers in a page */
    SEG = 4096,     /* one K (or V) of one layer of one block */
    SIDE = 1024,    /* sidecar piece (split in two segments) */
    BLOCKS = 16,    /* GPU blocks; 0 is the padding block, never saved */
    TOKENS_PER_BLOCK = 16,
    PREFIX = 6,     /* blocks of the prompt */
};
#define PAGE ((int64_t) LAYERS * 2 * SEG)

typedef struct {
    uint8_t *pages;   /* [BLOCKS][LAYERS][K|V][SEG] */
    uint8_t *sidecar; /* [2][BLOCKS][SIDE] */
} kv_cache;

static uint8_t pattern(int block, int arena, int seg, int i) {
    return (uint8_t) (block * 31 + arena * 7 + seg * 3 + i * 13 + 1);
}

static kv_cache cache_new(void) {
    kv_cache c = {calloc(BLOCKS, PAGE), calloc(2 * BLOCKS, SIDE)};
    return c;
}

static void fill(kv_cache *c, int block) {
    for (int l = 0; l < LAYERS; l++)
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < SEG; i++) c->pages[block * PAGE + (l * 2 + s) * SEG + i] = pattern(block, l, s, i);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < SIDE; i++) c->sidecar[(s * BLOCKS + block) * SIDE + i] = pattern(block, LAYERS, s, i);
}

/* dst holds exactly what fill(src) wrote. */
static int same_as(const kv_cache *c, int dst, int src) {
    for (int l = 0; l < LAYERS; l++)
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < SEG; i++)
                if (c->pages[dst * PAGE + (l * 2 + s) * SEG + i] != pattern(src, l, s, i)) return 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < SIDE; i++)
            if (c->sidecar[(s * BLOCKS + dst) * SIDE + i] != pattern(src, LAYERS, s, i)) return 0;
    return 1;
}

static int all_zero(const kv_cache *c, int block) {
    for (int64_t i = 0; i < PAGE; i++)
        if (c->pages[block * PAGE + i]) return 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < SIDE; i++)
            if (c->sidecar[(s * BLOCKS + block) * SIDE + i]) return 0;
    return 1;
}

static const char *ARENA_NAMES = "layer.00\nlayer.01\nsidecar";

/* The page-first arenas: layer l is base + l*2*SEG in every page (K|V one segment); the
   sidecar is K and V apart (two segments, V at BLOCKS*SIDE). */
static void arena_params(const kv_cache *c, int64_t p[(LAYERS + 1) * PEGAFLOW_ARENA_PARAMS]) {
    for (int l = 0; l < LAYERS; l++) {
        int64_t *a = &p[l * PEGAFLOW_ARENA_PARAMS];
        a[0] = (int64_t) (intptr_t) (c->pages + l * 2 * SEG);
        a[1] = BLOCKS;
        a[2] = PAGE;
        a[3] = 2 * SEG;
        a[4] = 1;
        a[5] = 0;
    }
    int64_t *a = &p[LAYERS * PEGAFLOW_ARENA_PARAMS];
    a[0] = (int64_t) (intptr_t) c->sidecar;
    a[1] = BLOCKS;
    a[2] = SIDE;
    a[3] = SIDE;
    a[4] = 2;
    a[5] = (int64_t) BLOCKS * SIDE;
}

static atomic_int callbacks;
static atomic_int callback_status;

static void on_done(int64_t completion, int32_t status, void *user) {
    (void) completion;
    atomic_store(&callback_status, status);
    atomic_fetch_add((atomic_int *) user, 1);
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static int64_t stat_value(int64_t engine, const char *name) {
    static char json[16384];
    int32_t len;
    CHECK(api->stats(engine, json, sizeof json, &len));
    char key[256];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *at = strstr(json, key);
    EXPECT(at != NULL, "stat %s in %.200s", name, json);
    return atoll(at + strlen(key));
}

/* Saves blocks[i] under hash i and waits for it. */
static void save_wait(int64_t engine, const char *inst, int n, const int64_t *blocks, const uint8_t *hashes, int hlen) {
    int64_t c, v[3];
    CHECK(api->save(engine, inst, 0, n, blocks, hashes, hlen, NULL, 0, &c));
    CHECK(api->wait(c, 10000, v));
    CHECK(api->completion_free(c));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s path/to/pegaflow.jar\n", argv[0]);
        return 2;
    }
    char err[4096];
    api = pegaflow_boot(argv[1], err, sizeof err);
    if (api == NULL) {
        fprintf(stderr, "pegaflow_boot: %s\n", err);
        return 3;
    }
    EXPECT(pegaflow_boot(argv[1], err, sizeof err) == api, "one JVM per process: the same table again");
    CHECK(api->noop());
    printf("JVM started from C: ABI %u, %u functions\n", api->abi_version, api->function_count);

    /* vLLM's keys for a 6-block prompt (+ a partial block, not keyed) */
    int32_t tokens[PREFIX * TOKENS_PER_BLOCK + 5];
    for (int i = 0; i < (int) (sizeof tokens / sizeof tokens[0]); i++) tokens[i] = 1000 + i * 7;
    uint8_t hashes[PREFIX * 16 + 16 * 8];
    int32_t count, hlen;
    CHECK(api->block_hashes("xxhash_cbor", "0", NULL, 0, tokens, sizeof tokens / sizeof tokens[0],
                            TOKENS_PER_BLOCK, hashes, sizeof hashes, &count, &hlen));
    EXPECT(count == PREFIX && hlen == 16, "6 hashes of 16 bytes, got %d of %d", count, hlen);

    kv_cache gpu = cache_new();
    int64_t src[PREFIX] = {1, 2, 3, 4, 5, 6};
    for (int i = 0; i < PREFIX; i++) fill(&gpu, (int) src[i]);

    int64_t engine;
    CHECK(api->engine_create("64mb", 1, 0, 0, 0, 0, "", &engine));
    int64_t params[(LAYERS + 1) * PEGAFLOW_ARENA_PARAMS];
    arena_params(&gpu, params);
    CHECK(api->register_rank(engine, "native", "llama-tiny/bf16/page16", 0, 0, 1, 0, 1, LAYERS + 1, ARENA_NAMES, params));
    EXPECT_ERROR(api->register_rank(engine, "native", "llama-tiny/bf16/page16", 0, 0, 1, 0, 1, LAYERS + 1, ARENA_NAMES,
                                    params), PF_INVALID_ARGUMENT, "already sealed"); /* a rank registers once */
    printf("registered a page-first cache (%d arenas, %lld bytes a page) in one call\n", LAYERS + 1, (long long) PAGE);

    /* save blocks 1..4: poll until done, wait, and a callback */
    int64_t c, v[3];
    CHECK(api->save(engine, "native", 0, 4, src, hashes, hlen, NULL, 0, &c));
    CHECK(api->completion_on_done(c, on_done, &callbacks));
    int32_t done = 0;
    for (int i = 0; i < 10000 && !done; i++) {
        CHECK(api->poll(c, &done));
        if (!done) sleep_ms(1);
    }
    EXPECT(done, "save done within 10 s");
    CHECK(api->wait(c, 0, v));
    EXPECT(v[0] == 4 && v[2] == 4 * (PAGE + 2 * SIDE), "4 blocks saved, %lld bytes; got %lld, %lld",
           (long long) (4 * (PAGE + 2 * SIDE)), (long long) v[0], (long long) v[2]);
    for (int i = 0; i < 5000 && atomic_load(&callbacks) < 1; i++) sleep_ms(1);
    EXPECT(atomic_load(&callbacks) == 1 && atomic_load(&callback_status) == 0, "callback once with status 0");
    CHECK(api->completion_on_done(c, on_done, &callbacks)); /* already done: runs now, on this thread */
    EXPECT(atomic_load(&callbacks) == 2, "a callback on a done completion runs at once");
    int64_t failed[4];
    int32_t nfailed = -1;
    CHECK(api->failed_blocks(c, failed, 4, &nfailed));
    EXPECT(nfailed == 0, "no failed blocks, got %d", nfailed);
    CHECK(api->completion_free(c));
    printf("saved 4 blocks: poll, wait (%lld bytes) and callback agree\n", (long long) v[2]);

    /* a save whose handle is dropped at once still lands; flush makes it visible */
    CHECK(api->save(engine, "native", 0, 1, &src[4], hashes + 4 * hlen, hlen, NULL, 0, &c));
    CHECK(api->completion_on_done(c, on_done, &callbacks));
    CHECK(api->completion_free(c));
    CHECK(api->flush(engine, 10000));
    for (int i = 0; i < 5000 && atomic_load(&callbacks) < 3; i++) sleep_ms(1);
    EXPECT(atomic_load(&callbacks) == 3, "the freed completion's callback fired");

    /* all-or-nothing: 5 of 6 resident -> loading, no lease */
    int32_t st[3];
    uint8_t lease[PEGAFLOW_LEASE_BYTES], zero[PEGAFLOW_LEASE_BYTES] = {0};
    CHECK(api->query_request(engine, "native", "req-decode", PREFIX, hashes, hlen, PF_QUERY_ALL_OR_NOTHING, st, lease));
    EXPECT(st[0] == PF_QUERY_LOADING && st[1] == 5 && st[2] == 1 && !memcmp(lease, zero, sizeof lease),
           "all-or-nothing loading with 5 of 6; got state %d hit %d missing %d", st[0], st[1], st[2]);
    EXPECT_ERROR(api->query_request(engine, "native", "req-decode", PREFIX - 1, hashes, hlen, 0, st, lease),
                 PF_INVALID_ARGUMENT, "expected the hashes it started with");
    save_wait(engine, "native", 1, &src[5], hashes + 5 * hlen, hlen);
    CHECK(api->flush(engine, 10000));
    CHECK(api->query_request(engine, "native", "req-decode", PREFIX, hashes, hlen, PF_QUERY_ALL_OR_NOTHING, st, lease));
    EXPECT(st[0] == PF_QUERY_READY && st[1] == PREFIX && st[2] == 0 && memcmp(lease, zero, sizeof lease),
           "ready with all 6; got state %d hit %d", st[0], st[1]);
    printf("all-or-nothing: loading with 5 of 6, ready with 6 after the last save and flush\n");

    /* the load is aborted (no free blocks): release the lease */
    EXPECT(stat_value(engine, "pegaflow_active_leases") == 1, "one lease held");
    CHECK(api->release(engine, "native", lease));
    EXPECT(stat_value(engine, "pegaflow_active_leases") == 0, "no lease after release");
    EXPECT_ERROR(api->release(engine, "native", lease), PF_UNKNOWN_LEASE, "lease");

    /* load into other blocks; untouched blocks stay zero */
    CHECK(api->query_request(engine, "native", "req-1", PREFIX, hashes, hlen, 0, st, lease));
    EXPECT(st[0] == PF_QUERY_READY && st[1] == PREFIX, "hit %d", st[1]);
    int64_t dst[PREFIX] = {9, 10, 11, 12, 13, 14};
    CHECK(api->load(engine, "native", 0, lease, PREFIX, dst, &c));
    CHECK(api->completion_on_done(c, on_done, &callbacks));
    CHECK(api->wait(c, 10000, v));
    CHECK(api->completion_free(c));
    for (int i = 0; i < 5000 && atomic_load(&callbacks) < 4; i++) sleep_ms(1);
    EXPECT(atomic_load(&callbacks) == 4, "load callback fired");
    for (int i = 0; i < PREFIX; i++)
        EXPECT(same_as(&gpu, (int) dst[i], (int) src[i]), "block %lld holds block %lld's bytes", (long long) dst[i],
               (long long) src[i]);
    EXPECT(all_zero(&gpu, 0) && all_zero(&gpu, 7) && all_zero(&gpu, 8) && all_zero(&gpu, 15), "untouched blocks zero");
    printf("loaded %lld blocks (%lld bytes) into other ids: every byte matches, untouched blocks zero\n",
           (long long) v[0], (long long) v[2]);

    /* cancel a loading request */
    uint8_t longer[(PREFIX + 2) * 16];
    memcpy(longer, hashes, PREFIX * 16);
    memset(longer + PREFIX * 16, 0xEE, 2 * 16);
    CHECK(api->query_request(engine, "native", "req-2", PREFIX + 2, longer, hlen, PF_QUERY_ALL_OR_NOTHING, st, lease));
    EXPECT(st[0] == PF_QUERY_LOADING, "loading");
    int32_t was = -1;
    CHECK(api->query_cancel(engine, "native", "req-2", &was));
    EXPECT(was == 1, "cancel of a loading request");
    CHECK(api->query_cancel(engine, "native", "req-2", &was));
    EXPECT(was == 0, "a second cancel finds nothing");

    /* another instance, registered the classic way with the same geometry, shares the namespace */
    kv_cache other = cache_new();
    int64_t lp[(LAYERS + 1) * PEGAFLOW_LAYER_PARAMS];
    for (int l = 0; l <= LAYERS; l++) {
        int64_t *a = &params[l * PEGAFLOW_ARENA_PARAMS], *p = &lp[l * PEGAFLOW_LAYER_PARAMS];
        int64_t base = l < LAYERS ? (int64_t) (intptr_t) (other.pages + l * 2 * SEG) : (int64_t) (intptr_t) other.sidecar;
        p[0] = l < LAYERS ? PF_COMBINED : PF_SPLIT_KV;
        p[1] = base;
        p[2] = l < LAYERS ? (BLOCKS - 1) * PAGE + 2 * SEG : 2L * BLOCKS * SIDE;
        p[3] = a[1];
        p[4] = a[2];
        p[5] = a[3];
        p[6] = a[5];
    }
    CHECK(api->register_instance(engine, "classic", "llama-tiny/bf16/page16", 1, 1));
    CHECK(api->register_worker(engine, "classic", 0, 0, 0, LAYERS + 1, ARENA_NAMES, lp));
    int32_t hit[2];
    CHECK(api->query(engine, "classic", PREFIX, hashes, hlen, hit, lease));
    EXPECT(hit[0] == PREFIX && hit[1] == 0, "the other instance hits %d", hit[0]);
    CHECK(api->load(engine, "classic", 0, lease, PREFIX, src, &c));
    CHECK(api->wait(c, 10000, v));
    CHECK(api->completion_free(c));
    for (int i = 0; i < PREFIX; i++) EXPECT(same_as(&other, (int) src[i], (int) src[i]), "classic block %d", i);
    CHECK(api->unregister_instance(engine, "classic"));
    printf("a second instance (register_instance + register_worker) loaded the same 6 blocks by the same hashes\n");

    /* pipeline parallel: two stages (pp_size 2), each registering its own layers; the instance
       seals with the second; a block is found once both stages saved their share */
    {
        kv_cache st0 = cache_new();
        int64_t pp0[PEGAFLOW_ARENA_PARAMS], pp1[2 * PEGAFLOW_ARENA_PARAMS], pv[3];
        int64_t all[(LAYERS + 1) * PEGAFLOW_ARENA_PARAMS];
        arena_params(&st0, all);
        memcpy(pp0, all, sizeof pp0);                                /* stage 0: layer.00 */
        memcpy(pp1, all + PEGAFLOW_ARENA_PARAMS, sizeof pp1);        /* stage 1: layer.01, sidecar */
        CHECK(api->register_rank(engine, "pp", "pp-namespace", 0, 0, 1, 0, 2, 1, "layer.00", pp0));
        int32_t ph[2];
        EXPECT_ERROR(api->query(engine, "pp", PREFIX, hashes, hlen, ph, lease), PF_REGISTRATION_INCOMPLETE, "pp");
        CHECK(api->register_rank(engine, "pp", "pp-namespace", 0, 0, 1, 1, 2, 2, "layer.01\nsidecar", pp1));
        for (int i = 0; i < PREFIX; i++) fill(&st0, (int) src[i]);
        int64_t pc;
        CHECK(api->save(engine, "pp", 0, PREFIX, src, hashes, hlen, NULL, 0, &pc));
        CHECK(api->wait(pc, 10000, pv));
        CHECK(api->completion_free(pc));
        CHECK(api->query(engine, "pp", PREFIX, hashes, hlen, ph, lease));
        EXPECT(ph[0] == 0, "a block with one stage's share is not resident (hit %d)", ph[0]);
        CHECK(api->save(engine, "pp", 1, PREFIX, src, hashes, hlen, NULL, 0, &pc));
        CHECK(api->wait(pc, 10000, pv));
        CHECK(api->completion_free(pc));
        CHECK(api->query(engine, "pp", PREFIX, hashes, hlen, ph, lease));
        EXPECT(ph[0] == PREFIX, "both stages saved: hit %d", ph[0]);
        CHECK(api->release(engine, "pp", lease));
        CHECK(api->unregister_instance(engine, "pp"));
        free(st0.pages);
        free(st0.sidecar);
        printf("pipeline parallel: two stages registered their layers with register_rank; a block is resident "
               "once both saved\n");
    }

    /* bad calls: a code and a message naming the value; nothing changes */
    int64_t bad[PEGAFLOW_ARENA_PARAMS];
    memcpy(bad, params, sizeof bad);
    bad[4] = 3;
    EXPECT_ERROR(api->register_rank(engine, "x", "ns", 0, 0, 1, 0, 1, 1, "a", bad), PF_INVALID_ARGUMENT,
                 "segments 3; expected 1 or 2");
    EXPECT_ERROR(api->register_rank(engine, "x", "ns", 0, 2, 1, 0, 1, 1, "a", params), PF_INVALID_ARGUMENT,
                 "tp_rank 2 of tp_size 1");
    EXPECT_ERROR(api->query_request(engine, "native", "r", PREFIX, hashes, hlen, 4, st, lease), PF_INVALID_ARGUMENT,
                 "flags 4");
    EXPECT_ERROR(api->query_request(engine, "native", "", PREFIX, hashes, hlen, 0, st, lease), PF_INVALID_ARGUMENT,
                 "request id");
    EXPECT_ERROR(api->query_request(engine, "native", "r", 1 << 30, hashes, hlen, 0, st, lease), PF_INVALID_ARGUMENT,
                 "MAX_HASHES_PER_CALL"); /* refused before 16 GiB is read or allocated */
    EXPECT_ERROR(api->completion_on_done(12345, NULL, NULL), PF_INVALID_ARGUMENT, "callback is NULL");
    EXPECT_ERROR(api->wait(987654321, 0, v), PF_INVALID_ARGUMENT, "completion handle 987654321");
    EXPECT_ERROR(api->block_hashes("xxhash", NULL, NULL, 0, tokens, 16, 16, hashes, sizeof hashes, &count, &hlen),
                 PF_INVALID_ARGUMENT, "PYTHONHASHSEED");
    EXPECT_ERROR(api->flush(424242, 0), PF_INVALID_ARGUMENT, "engine handle 424242");
    char msg[512];
    int32_t rc = api->query(engine, "no-such-instance", PREFIX, hashes, hlen, hit, lease);
    api->last_error(msg, sizeof msg);
    EXPECT(rc == PF_UNKNOWN_INSTANCE && strstr(msg, "no-such-instance"), "code %d '%s'", rc, msg);
    printf("bad input: code %d: %s\n", rc, msg);
    CHECK(api->query(engine, "native", PREFIX, hashes, hlen, hit, lease));
    EXPECT(hit[0] == PREFIX, "after the bad calls all 6 still hit");
    CHECK(api->release(engine, "native", lease));

    char stats[16384];
    int32_t len;
    CHECK(api->stats(engine, stats, sizeof stats, &len));
    CHECK(api->engine_close(engine));

    /* an SSD tier below a small pool: an evicted prefix answers "loading", then "ready" */
    char dir[] = "/tmp/pegaflow-roundtrip-ssd-XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "a temporary directory");
    char ssd[256];
    snprintf(ssd, sizeof ssd, "ssd_cache_path=%s\nssd_cache_capacity=32mb", dir);
    int64_t small;
    CHECK(api->engine_create("2mb", 1, 0, 0, 0, 0, ssd, &small));
    kv_cache g2 = cache_new();
    arena_params(&g2, params);
    CHECK(api->register_rank(small, "native", "llama-tiny/bf16/page16", 0, 0, 1, 0, 1, LAYERS + 1, ARENA_NAMES, params));
    for (int i = 0; i < PREFIX; i++) fill(&g2, (int) src[i]);
    save_wait(small, "native", 4, src, hashes, hlen);
    for (int i = 0; i < 10000 && stat_value(small, "pegaflow_ssd_write_blocks_total") < 4; i++) sleep_ms(1);
    EXPECT(stat_value(small, "pegaflow_ssd_write_blocks_total") >= 4, "4 blocks written to SSD");
    /* fill the pool with other blocks until the prefix is evicted */
    uint8_t filler[15 * 16];
    int64_t ids[15];
    for (int round = 0; round < 12; round++) {
        for (int i = 0; i < 15; i++) {
            ids[i] = 1 + i;
            memset(filler + i * 16, 0, 16);
            filler[i * 16] = 0xF0;
            filler[i * 16 + 1] = (uint8_t) round;
            filler[i * 16 + 2] = (uint8_t) i;
        }
        save_wait(small, "native", 15, ids, filler, 16);
    }
    CHECK(api->query(small, "native", 1, hashes, hlen, hit, lease));
    EXPECT(hit[0] == 0, "the prefix left the 2 MB pool (hit %d)", hit[0]);
    int loading = 0, polls = 0;
    for (; polls < 10000; polls++) {
        CHECK(api->query_request(small, "native", "req-ssd", 4, hashes, hlen, 0, st, lease));
        if (st[0] == PF_QUERY_READY) break;
        loading++;
        sleep_ms(1);
    }
    EXPECT(loading >= 1 && st[0] == PF_QUERY_READY && st[1] == 4, "loading then ready with 4; loading %d, hit %d",
           loading, st[1]);
    int64_t dst2[4] = {9, 10, 11, 12};
    CHECK(api->load(small, "native", 0, lease, 4, dst2, &c));
    CHECK(api->wait(c, 10000, v));
    CHECK(api->completion_free(c));
    for (int i = 0; i < 4; i++) EXPECT(same_as(&g2, (int) dst2[i], (int) src[i]), "SSD block %d", i);
    printf("SSD tier: the evicted prefix answered loading %d time(s), then ready with 4 blocks, loaded byte-exact\n",
           loading);
    CHECK(api->engine_close(small));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    EXPECT(system(cmd) == 0, "removed %s", dir);

    CHECK(api->shutdown());
    printf("roundtrip ok\n");
    return 0;
}
