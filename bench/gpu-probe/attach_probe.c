// What a worker's attach to a shared pool costs on the page sizes a host can give it.
// docs/gpu.md "Pool attach"; run by ci/gpu-attach-probe.sh on the GPU machine.
//
//   attach_probe create PATH BYTES THREADS   make the pool file and commit every page (the
//                                            server's --prefault-threads), then exit
//   attach_probe attach PATH BYTES DEVICE [populate]
//                                            map it as a worker does (MAP_SHARED), optionally
//                                            populate the page tables first, then pin it for
//                                            CUDA (PORTABLE | DEVICEMAP); prints one JSON line
//
// Build: nvcc -O2 -o attach_probe attach_probe.c -lcuda -lpthread
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void cu(CUresult r, const char *what) {
    if (r != CUDA_SUCCESS) {
        const char *s = "?";
        cuGetErrorString(r, &s);
        fprintf(stderr, "%s: %s (%d)\n", what, s, (int)r);
        exit(1);
    }
}

struct part { char *base; size_t from, to; };

static void *touch(void *arg) {
    struct part *p = arg;
    for (size_t o = p->from; o < p->to; o += 4096) {
        p->base[o] = 1;
    }
    return NULL;
}

// Pages of the mapping backed by PMD-sized (huge) pages, from /proc/self/smaps_rollup.
static long huge_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kb = 0, v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1 || sscanf(line, "FilePmdMapped: %ld kB", &v) == 1) kb += v;
        if (sscanf(line, "Private_Hugetlb: %ld kB", &v) == 1 || sscanf(line, "Shared_Hugetlb: %ld kB", &v) == 1) kb += v;
    }
    fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s create PATH BYTES THREADS | attach PATH BYTES DEVICE [populate]\n", argv[0]);
        return 2;
    }
    const char *path = argv[2];
    size_t bytes = strtoull(argv[3], NULL, 10);
    if (strcmp(argv[1], "create") == 0) {
        int threads = atoi(argv[4]);
        double t0 = now();
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) die("open");
        if (ftruncate(fd, (off_t)bytes) != 0) die("ftruncate");
        char *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) die("mmap");
        madvise(base, bytes, MADV_HUGEPAGE); // matters where the mount's huge= is advise
        pthread_t tid[256];
        struct part parts[256];
        if (threads < 1 || threads > 256) threads = 1;
        size_t step = (bytes / threads + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        for (int i = 0; i < threads; i++) {
            parts[i].base = base;
            parts[i].from = step * i < bytes ? step * i : bytes;
            parts[i].to = step * (i + 1) < bytes ? step * (i + 1) : bytes;
            pthread_create(&tid[i], NULL, touch, &parts[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        printf("{\"create_s\": %.3f, \"huge_kb\": %ld}\n", now() - t0, huge_kb());
        return 0;
    }
    int device = atoi(argv[4]);
    int populate = argc > 5 && strcmp(argv[5], "populate") == 0;
    double t0 = now();
    cu(cuInit(0), "cuInit");
    CUdevice dev;
    CUcontext ctx;
    cu(cuDeviceGet(&dev, device), "cuDeviceGet");
    cu(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    cu(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    double t1 = now();
    int fd = open(path, O_RDWR);
    if (fd < 0) die("open");
    char *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (base == MAP_FAILED) die("mmap");
    double t2 = now();
    cu(cuMemHostRegister(base, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP), "cuMemHostRegister");
    double t3 = now();
    // the pinned pool is usable: one 2 MiB copy each way through it
    CUdeviceptr d;
    cu(cuMemAlloc(&d, 2u << 20), "cuMemAlloc");
    cu(cuMemcpyHtoD(d, base + bytes - (2u << 20), 2u << 20), "cuMemcpyHtoD");
    cu(cuMemcpyDtoH(base, d, 2u << 20), "cuMemcpyDtoH");
    printf("{\"cuda_init_s\": %.3f, \"map_s\": %.3f, \"register_s\": %.3f, \"attach_s\": %.3f, \"huge_kb\": %ld, "
           "\"gb\": %.1f}\n", t1 - t0, t2 - t1, t3 - t2, t3 - t0, huge_kb(), bytes / 1e9);
    return 0;
}
