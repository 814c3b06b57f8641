// Gather/scatter copy between device memory and mapped pinned host memory (the host pool).
// A descriptor is three 64-bit words: source address, destination address, byte count.
// One CTA per descriptor (grid-strided when there are more descriptors than CTAs): vLLM's
// pieces are 16-64 KiB, so a CTA of 256 threads moves a piece in a few rounds of 16-byte
// vectors, and thousands of CTAs keep enough PCIe reads in flight to fill the link. Each
// thread issues four loads before its four stores so reads over PCIe overlap.
extern "C" __global__ void __launch_bounds__(256)
pega_copy(const unsigned long long* __restrict__ desc, unsigned int count) {
    for (unsigned int i = blockIdx.x; i < count; i += gridDim.x) {
        const unsigned long long src = desc[3 * (unsigned long long) i];
        const unsigned long long dst = desc[3 * (unsigned long long) i + 1];
        const unsigned long long len = desc[3 * (unsigned long long) i + 2];
        if (((src | dst | len) & 15ull) == 0ull) {
            const uint4* __restrict__ s = reinterpret_cast<const uint4*>(src);
            uint4* __restrict__ d = reinterpret_cast<uint4*>(dst);
            const unsigned long long n = len >> 4;
            const unsigned long long step = blockDim.x;
            unsigned long long j = threadIdx.x;
            for (; j + 3 * step < n; j += 4 * step) {
                const uint4 a = s[j];
                const uint4 b = s[j + step];
                const uint4 c = s[j + 2 * step];
                const uint4 e = s[j + 3 * step];
                d[j] = a;
                d[j + step] = b;
                d[j + 2 * step] = c;
                d[j + 3 * step] = e;
            }
            for (; j < n; j += step) {
                d[j] = s[j];
            }
        } else {
            const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
            unsigned char* d = reinterpret_cast<unsigned char*>(dst);
            for (unsigned long long j = threadIdx.x; j < len; j += blockDim.x) {
                d[j] = s[j];
            }
        }
    }
}
