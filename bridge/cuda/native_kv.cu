/*
 * native_kv.cu - a native inference engine on the GPU embedding the PegaFlow-JVM store through
 * the C ABI (pegaflow.h, pegaflow_boot.h), the way PegaInfer embeds the original PegaFlow.
 *
 * It lays out a page-first paged KV cache (one allocation; a page per block holding every
 * layer's K|V slot, Llama-3.1-8B geometry: 32 layers x 16 tokens x 8 heads x 128, bf16: 64 KiB
 * a layer, 2 MiB a page; block 0 is the padding block), writes a deterministic pattern keyed by
 * (block, layer, segment) with a kernel on its own stream, and for each of two registrations:
 *   shared: arenas named as vLLM names its layers, in a namespace a vLLM connector shares;
 *   page:   arenas named in page order, so each block is one contiguous 2 MiB run;
 * saves N blocks through the ABI ordered after that stream (no host sync), flushes, queries
 * with a request id (all-or-nothing: the expected hit), loads into other blocks, compares
 * every bit on the GPU and checks that untouched blocks stay zero; then times saves of fresh
 * prompts and loads, and prints one JSON line. Keys are vLLM's block hashes (block_hashes,
 * xxhash_cbor, seed "0") of a deterministic prompt: a vLLM connector loads the same blocks by
 * computing the same hashes (python -m pegaflow.bench.native_peer).
 *
 *   nvcc -O2 -std=c++17 -I<jdk>/include -I<jdk>/include/linux -Ibridge/include \
 *        bridge/cuda/native_kv.cu -ldl -o native_kv
 *   PEGAFLOW_JAVA_HOME=<runtime> ./native_kv <pegaflow.jar> <server HOST:PORT> [blocks] [reps]
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pegaflow.h"
#include "pegaflow_boot.h"

static const pegaflow_api *api;

#include "pegaflow_check.h"

#define CU(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

constexpr int L = 32, H = 8, D = 128, BS = 16;
constexpr int64_t SLOT_ELEMS = (int64_t) BS * H * 2 * D;  /* one layer of one block: [token][head][K|V] */
constexpr int64_t SLOT = SLOT_ELEMS * 2;                    /* bytes (bf16): 64 KiB */
constexpr int64_t PAGE = SLOT * L;                          /* 2 MiB */

/* The pattern: logical block (position in the prompt), layer, segment (0 K, 1 V), element.
   Also computed by pegaflow.bench.native_peer, which checks what the vLLM connector loaded. */
__host__ __device__ inline uint16_t pattern(int64_t logical, int layer, int64_t e) {
    int seg = (int) ((e % (2 * D)) >= D);
    return (uint16_t) ((logical * 40503 + layer * 2531 + seg * 977 + e * 3 + 1) & 0xFFFF);
}

__global__ void fill(uint16_t *kv, int64_t first_block, int64_t n, int64_t logical0) {
    int64_t total = n * L * SLOT_ELEMS;
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < total; i += (int64_t) gridDim.x * blockDim.x) {
        int64_t b = i / (L * SLOT_ELEMS), rest = i % (L * SLOT_ELEMS);
        int layer = (int) (rest / SLOT_ELEMS);
        int64_t e = rest % SLOT_ELEMS;
        kv[(first_block + b) * (PAGE / 2) + rest] = pattern(logical0 + b, layer, e);
    }
}

/* Counts elements of blocks dst[k] that differ from pattern(k), and nonzero elements of the
   control blocks. */
__global__ void check(const uint16_t *kv, const int64_t *dst, int64_t n, const int64_t *zero, int nzero,
                      unsigned long long *bad, unsigned long long *nonzero) {
    int64_t total = n * L * SLOT_ELEMS, ztotal = (int64_t) nzero * L * SLOT_ELEMS;
    for (int64_t i = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; i < total + ztotal;
         i += (int64_t) gridDim.x * blockDim.x) {
        if (i < total) {
            int64_t k = i / (L * SLOT_ELEMS), rest = i % (L * SLOT_ELEMS);
            if (kv[dst[k] * (PAGE / 2) + rest] != pattern(k, (int) (rest / SLOT_ELEMS), rest % SLOT_ELEMS))
                atomicAdd(bad, 1ULL);
        } else {
            int64_t j = i - total, k = j / (L * SLOT_ELEMS), rest = j % (L * SLOT_ELEMS);
            if (kv[zero[k] * (PAGE / 2) + rest] != 0) atomicAdd(nonzero, 1ULL);
        }
    }
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* vLLM's block hashes of a deterministic prompt of n full blocks (+1 token), variant rep. */
static std::vector<uint8_t> prompt_hashes(int64_t n, int rep) {
    std::vector<int32_t> tokens(n * BS + 1);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = 3 + (int32_t) ((i * 7919 + (size_t) rep * 104729) % 32000);
    std::vector<uint8_t> h(n * 16);
    int32_t count = 0, len = 0;
    CHECK(api->block_hashes("xxhash_cbor", "0", nullptr, 0, tokens.data(), (int64_t) tokens.size(), BS, h.data(),
                         (int64_t) h.size(), &count, &len));
    EXPECT(count == n && len == 16, "%lld hashes of 16 bytes; got %d of %d", (long long) n, count, len);
    return h;
}

static std::atomic<int> saves_done{0};
static std::atomic<double> save_done_at{0};

static void on_save(int64_t, int32_t status, void *) {
    if (status == PF_OK) save_done_at.store(now_s());
    saves_done.fetch_add(1);
}

struct Timing {
    std::vector<double> save_gbps, load_gbps;
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s pegaflow.jar HOST:PORT [blocks] [reps]\n", argv[0]);
        return 2;
    }
    const int64_t n = argc > 3 ? atoll(argv[3]) : 2048;
    const int reps = argc > 4 ? atoi(argv[4]) : 3;
    const int64_t nb = 2 * n + 2; /* 0 padding, 1..n sources, n+1..2n destinations, 2n+1 control */
    char err[4096];
    double t_boot = now_s();
    api = pegaflow_boot(argv[1], err, sizeof err);
    if (!api) {
        fprintf(stderr, "pegaflow_boot: %s\n", err);
        return 3;
    }
    t_boot = now_s() - t_boot;

    CU(cudaSetDevice(0));
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    uint16_t *kv;
    CU(cudaMalloc(&kv, nb * PAGE));
    CU(cudaMemset(kv, 0, nb * PAGE));
    cudaStream_t compute;
    CU(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    std::vector<int64_t> src(n), dst(n);
    for (int64_t i = 0; i < n; i++) {
        src[i] = 1 + i;
        dst[i] = n + 1 + i;
    }
    int64_t zero_ids[2] = {0, 2 * n + 1}, *d_dst, *d_zero;
    unsigned long long *d_bad;
    CU(cudaMalloc(&d_dst, n * 8));
    CU(cudaMalloc(&d_zero, 16));
    CU(cudaMalloc(&d_bad, 16));
    CU(cudaMemcpy(d_dst, dst.data(), n * 8, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_zero, zero_ids, 16, cudaMemcpyHostToDevice));

    /* the line in this run: one large pinned copy each way (docs/gpu.md's 55.4 GB/s) */
    double line_h2d = 0, line_d2h = 0;
    {
        const size_t bytes = (size_t) 2 << 30;
        void *host;
        CU(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
        memset(host, 1, bytes);
        for (int r = 0; r < 3; r++) {
            double t0 = now_s();
            CU(cudaMemcpyAsync(kv, host, bytes, cudaMemcpyHostToDevice, compute));
            CU(cudaStreamSynchronize(compute));
            line_h2d = std::max(line_h2d, bytes / (now_s() - t0) / 1e9);
            t0 = now_s();
            CU(cudaMemcpyAsync(host, kv, bytes, cudaMemcpyDeviceToHost, compute));
            CU(cudaStreamSynchronize(compute));
            line_d2h = std::max(line_d2h, bytes / (now_s() - t0) / 1e9);
        }
        CU(cudaFreeHost(host));
        CU(cudaMemset(kv, 0, nb * PAGE));
        printf("line: H2D %.2f GB/s, D2H %.2f GB/s (one 2 GiB pinned copy, best of 3)\n", line_h2d, line_d2h);
    }

    double t_connect = now_s();
    int64_t engine;
    CHECK(api->engine_connect(argv[2], 1, /* CUDA copies */ 1, 0, 30000, &engine));
    t_connect = now_s() - t_connect;

    std::string json = "{\"device\":\"" + std::string(prop.name) + "\",\"blocks\":" + std::to_string(n) +
                       ",\"block_bytes\":" + std::to_string(PAGE) + ",\"reps\":" + std::to_string(reps) +
                       ",\"jvm_start_s\":" + std::to_string(t_boot) + ",\"connect_s\":" + std::to_string(t_connect) +
                       ",\"line_h2d_gbps\":" + std::to_string(line_h2d) + ",\"line_d2h_gbps\":" + std::to_string(line_d2h);
    const char *variants[2] = {"shared", "page"};
    for (int v = 0; v < 2; v++) {
        std::string inst = std::string("native-") + variants[v];
        std::string ns = v == 0 ? "native-share/llama-8b-geometry" : "native-page-first/llama-8b-geometry";
        std::string names;
        std::vector<int64_t> params(L * PEGAFLOW_ARENA_PARAMS);
        for (int l = 0; l < L; l++) {
            char name[64];
            if (v == 0) snprintf(name, sizeof name, "model.layers.%d.self_attn.attn", l);
            else snprintf(name, sizeof name, "layer.%02d", l);
            names += (l ? "\n" : "") + std::string(name);
            int64_t *a = &params[l * PEGAFLOW_ARENA_PARAMS];
            a[0] = (int64_t) (uintptr_t) ((char *) kv + l * SLOT);
            a[1] = nb;
            a[2] = PAGE;
            a[3] = SLOT;
            a[4] = 1; /* vLLM's order: K|V per token and head, one segment */
            a[5] = 0;
        }
        CHECK(api->register_rank(engine, inst.c_str(), ns.c_str(), 0, 0, 1, 0, 1, L, names.c_str(), params.data()));

        /* rep 0: the prompt a vLLM connector will load (shared variant); checked bit for bit */
        CU(cudaMemset(kv, 0, nb * PAGE));
        fill<<<1024, 256, 0, compute>>>(kv, 1, n, 0);
        CU(cudaGetLastError());
        std::vector<uint8_t> h0 = prompt_hashes(n, 0);
        int64_t c, vals[3];
        /* ORDERING: the save waits for the fill queued on `compute` (no host sync here) */
        CHECK(api->save(engine, inst.c_str(), 0, (int32_t) n, src.data(), h0.data(), 16, nullptr, (int64_t) compute, &c));
        CHECK(api->completion_on_done(c, on_save, nullptr));
        CHECK(api->wait(c, 120000, vals));
        CHECK(api->completion_free(c));
        EXPECT(vals[0] == n, "saved %lld blocks, got %lld", (long long) n, (long long) vals[0]);
        CHECK(api->flush(engine, 30000));
        int32_t st[3];
        uint8_t lease[PEGAFLOW_LEASE_BYTES];
        CHECK(api->query_request(engine, inst.c_str(), "check", (int32_t) n, h0.data(), 16, PF_QUERY_ALL_OR_NOTHING, st, lease));
        EXPECT(st[0] == PF_QUERY_READY && st[1] == n, "ready with %lld; state %d hit %d", (long long) n, st[0], st[1]);
        CHECK(api->load(engine, inst.c_str(), 0, lease, (int32_t) n, dst.data(), &c));
        CHECK(api->wait(c, 120000, vals));
        CHECK(api->completion_free(c));
        CU(cudaMemset(d_bad, 0, 16));
        check<<<1024, 256>>>(kv, d_dst, n, d_zero, 2, d_bad, d_bad + 1);
        unsigned long long bad[2];
        CU(cudaMemcpy(bad, d_bad, 16, cudaMemcpyDeviceToHost));
        EXPECT(bad[0] == 0 && bad[1] == 0, "%s: %llu elements differ, %llu nonzero in untouched blocks", variants[v],
               bad[0], bad[1]);
        printf("%s: saved %lld blocks from the compute stream, flushed, query ready with %d, loaded into other "
               "blocks: every bit equal, untouched blocks zero\n", variants[v], (long long) n, st[1]);
        fflush(stdout);

        /* timing: saves of fresh prompts (each a new chain of hashes), then loads of prompt 0 */
        Timing t;
        for (int r = 1; r <= reps; r++) {
            std::vector<uint8_t> h = prompt_hashes(n, 100 * v + r);
            fill<<<1024, 256, 0, compute>>>(kv, 1, n, r);
            CU(cudaStreamSynchronize(compute));
            int before = saves_done.load();
            double t0 = now_s();
            CHECK(api->save(engine, inst.c_str(), 0, (int32_t) n, src.data(), h.data(), 16, nullptr, 0, &c));
            CHECK(api->completion_on_done(c, on_save, nullptr));
            CHECK(api->wait(c, 120000, vals));
            while (saves_done.load() == before) std::this_thread::yield();
            double secs = save_done_at.load() - t0;
            CHECK(api->completion_free(c));
            EXPECT(vals[0] == n, "fresh save of %lld blocks", (long long) n);
            t.save_gbps.push_back(n * PAGE / secs / 1e9);
        }
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            CHECK(api->query_request(engine, inst.c_str(), "load", (int32_t) n, h0.data(), 16, 0, st, lease));
            EXPECT(st[0] == PF_QUERY_READY && st[1] == n, "hit %d", st[1]);
            CHECK(api->load(engine, inst.c_str(), 0, lease, (int32_t) n, dst.data(), &c));
            CHECK(api->wait(c, 120000, vals));
            double secs = now_s() - t0;
            CHECK(api->completion_free(c));
            t.load_gbps.push_back(n * PAGE / secs / 1e9);
        }
        char part[512];
        snprintf(part, sizeof part,
                 ",\"%s\":{\"namespace\":\"%s\",\"save_gbps\":%.2f,\"load_gbps\":%.2f,\"save_all\":[%.2f,%.2f,%.2f],"
                 "\"load_all\":[%.2f,%.2f,%.2f],\"bits_equal\":true,\"untouched_zero\":true}",
                 variants[v], ns.c_str(), median(t.save_gbps), median(t.load_gbps), t.save_gbps[0],
                 t.save_gbps.size() > 1 ? t.save_gbps[1] : 0, t.save_gbps.size() > 2 ? t.save_gbps[2] : 0,
                 t.load_gbps[0], t.load_gbps.size() > 1 ? t.load_gbps[1] : 0,
                 t.load_gbps.size() > 2 ? t.load_gbps[2] : 0);
        json += part;
        printf("%s: save %.2f GB/s, load %.2f GB/s (median of %d, %lld x %lld bytes; query+load timed together)\n",
               variants[v], median(t.save_gbps), median(t.load_gbps), reps, (long long) n, (long long) PAGE);
        fflush(stdout);
        if (v == 1) CHECK(api->unregister_instance(engine, inst.c_str()));
        /* the shared variant stays registered: its blocks stay in the server for the vLLM connector */
    }
    json += "}";
    printf("%s\n", json.c_str());
    CHECK(api->engine_close(engine));
    CHECK(api->shutdown());
    return 0;
}
