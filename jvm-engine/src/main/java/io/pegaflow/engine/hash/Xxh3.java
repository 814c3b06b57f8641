package io.pegaflow.engine.hash;

/**
 * XXH3-128 (xxHash 0.8, default secret, seed 0), as vLLM's {@code xxhash} prefix-caching
 * algorithms call it ({@code xxhash.xxh3_128_digest}): the 16-byte canonical digest, the high
 * half first, each half big-endian. Checked against the {@code xxhash} package on every input
 * length class (0, 1-3, 4-8, 9-16, 17-128, 129-240, long).
 */
public final class Xxh3 {
    private static final long P32_1 = 0x9E3779B1L, P32_2 = 0x85EBCA77L, P32_3 = 0xC2B2AE3DL;
    private static final long P64_1 = 0x9E3779B185EBCA87L, P64_2 = 0xC2B2AE3D27D4EB4FL, P64_3 = 0x165667B19E3779F9L,
            P64_4 = 0x85EBCA77C2B2AE63L, P64_5 = 0x27D4EB2F165667C5L;
    private static final long PRIME_MX1 = 0x165667919E3779F9L, PRIME_MX2 = 0x9FB21C651E98DF25L;
    private static final byte[] SECRET = bytes(
            0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
            0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
            0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
            0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
            0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
            0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
            0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
            0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
            0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
            0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
            0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
            0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e);
    private static final int STRIPE = 64, RATE = 8, STRIPES_PER_BLOCK = (SECRET.length - STRIPE) / RATE,
            BLOCK = STRIPE * STRIPES_PER_BLOCK;

    private Xxh3() {}

    private static byte[] bytes(int... v) {
        byte[] b = new byte[v.length];
        for (int i = 0; i < v.length; i++) {
            b[i] = (byte) v[i];
        }
        return b;
    }

    /** The canonical 16-byte XXH3-128 digest of {@code in[0, len)}. */
    public static byte[] digest128(byte[] in, int len) {
        long[] h = hash128(in, len);
        byte[] out = new byte[16];
        for (int i = 0; i < 8; i++) {
            out[i] = (byte) (h[1] >>> (56 - 8 * i));
            out[8 + i] = (byte) (h[0] >>> (56 - 8 * i));
        }
        return out;
    }

    /** {low64, high64}. */
    static long[] hash128(byte[] in, int len) {
        if (len <= 16) {
            if (len > 8) {
                return len9to16(in, len);
            }
            if (len >= 4) {
                return len4to8(in, len);
            }
            if (len > 0) {
                return len1to3(in, len);
            }
            return new long[] {avalanche64(le64(SECRET, 64) ^ le64(SECRET, 72)), avalanche64(le64(SECRET, 80) ^ le64(SECRET, 88))};
        }
        if (len <= 128) {
            return len17to128(in, len);
        }
        if (len <= 240) {
            return len129to240(in, len);
        }
        return hashLong(in, len);
    }

    private static long le64(byte[] b, int i) {
        return (b[i] & 0xffL) | (b[i + 1] & 0xffL) << 8 | (b[i + 2] & 0xffL) << 16 | (b[i + 3] & 0xffL) << 24
                | (b[i + 4] & 0xffL) << 32 | (b[i + 5] & 0xffL) << 40 | (b[i + 6] & 0xffL) << 48 | (b[i + 7] & 0xffL) << 56;
    }

    private static long le32(byte[] b, int i) {
        return (b[i] & 0xffL) | (b[i + 1] & 0xffL) << 8 | (b[i + 2] & 0xffL) << 16 | (b[i + 3] & 0xffL) << 24;
    }

    private static long avalanche64(long h) {
        h ^= h >>> 33;
        h *= P64_2;
        h ^= h >>> 29;
        h *= P64_3;
        return h ^ (h >>> 32);
    }

    private static long avalanche3(long h) {
        h ^= h >>> 37;
        h *= PRIME_MX1;
        return h ^ (h >>> 32);
    }

    private static long fold64(long a, long b) {
        return a * b ^ Math.unsignedMultiplyHigh(a, b);
    }

    private static long mix16(byte[] in, int i, int s) {
        return fold64(le64(in, i) ^ le64(SECRET, s), le64(in, i + 8) ^ le64(SECRET, s + 8));
    }

    private static long[] len1to3(byte[] in, int len) {
        long c1 = in[0] & 0xff, c2 = in[len >> 1] & 0xff, c3 = in[len - 1] & 0xff;
        int combinedl = (int) (c1 << 16 | c2 << 24 | c3 | (long) len << 8);
        int combinedh = Integer.rotateLeft(Integer.reverseBytes(combinedl), 13);
        long bitflipl = le32(SECRET, 0) ^ le32(SECRET, 4);
        long bitfliph = le32(SECRET, 8) ^ le32(SECRET, 12);
        return new long[] {avalanche64((combinedl & 0xffffffffL) ^ bitflipl), avalanche64((combinedh & 0xffffffffL) ^ bitfliph)};
    }

    private static long[] len4to8(byte[] in, int len) {
        long inputLo = le32(in, 0), inputHi = le32(in, len - 4);
        long input64 = inputLo + (inputHi << 32);
        long keyed = input64 ^ (le64(SECRET, 16) ^ le64(SECRET, 24));
        long m = P64_1 + ((long) len << 2);
        long lo = keyed * m, hi = Math.unsignedMultiplyHigh(keyed, m);
        hi += lo << 1;
        lo ^= hi >>> 3;
        lo ^= lo >>> 35;
        lo *= PRIME_MX2;
        lo ^= lo >>> 28;
        return new long[] {lo, avalanche3(hi)};
    }

    private static long[] len9to16(byte[] in, int len) {
        long bitflipl = le64(SECRET, 32) ^ le64(SECRET, 40);
        long bitfliph = le64(SECRET, 48) ^ le64(SECRET, 56);
        long inputLo = le64(in, 0), inputHi = le64(in, len - 8);
        long a = inputLo ^ inputHi ^ bitflipl;
        long mLo = a * P64_1, mHi = Math.unsignedMultiplyHigh(a, P64_1);
        mLo += (long) (len - 1) << 54;
        inputHi ^= bitfliph;
        mHi += inputHi + (inputHi & 0xffffffffL) * (P32_2 - 1);
        mLo ^= Long.reverseBytes(mHi);
        long hLo = mLo * P64_2, hHi = Math.unsignedMultiplyHigh(mLo, P64_2);
        hHi += mHi * P64_2;
        return new long[] {avalanche3(hLo), avalanche3(hHi)};
    }

    /** acc = {low, high}; mixes 32 bytes (16 at i1, 16 at i2) with the secret at s. */
    private static void mix32(long[] acc, byte[] in, int i1, int i2, int s, long seed) {
        acc[0] += fold64(le64(in, i1) ^ (le64(SECRET, s) + seed), le64(in, i1 + 8) ^ (le64(SECRET, s + 8) - seed));
        acc[0] ^= le64(in, i2) + le64(in, i2 + 8);
        acc[1] += fold64(le64(in, i2) ^ (le64(SECRET, s + 16) + seed), le64(in, i2 + 8) ^ (le64(SECRET, s + 24) - seed));
        acc[1] ^= le64(in, i1) + le64(in, i1 + 8);
    }

    private static long[] finish(long[] acc, int len) {
        long lo = acc[0] + acc[1];
        long hi = acc[0] * P64_1 + acc[1] * P64_4 + (long) len * P64_2;
        return new long[] {avalanche3(lo), -avalanche3(hi)};
    }

    private static long[] len17to128(byte[] in, int len) {
        long[] acc = {(long) len * P64_1, 0};
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    mix32(acc, in, 48, len - 64, 96, 0);
                }
                mix32(acc, in, 32, len - 48, 64, 0);
            }
            mix32(acc, in, 16, len - 32, 32, 0);
        }
        mix32(acc, in, 0, len - 16, 0, 0);
        return finish(acc, len);
    }

    private static long[] len129to240(byte[] in, int len) {
        long[] acc = {(long) len * P64_1, 0};
        for (int i = 32; i < 160; i += 32) {
            mix32(acc, in, i - 32, i - 16, i - 32, 0);
        }
        acc[0] = avalanche3(acc[0]);
        acc[1] = avalanche3(acc[1]);
        for (int i = 160; i <= len; i += 32) {
            mix32(acc, in, i - 32, i - 16, 3 + i - 160, 0);
        }
        mix32(acc, in, len - 16, len - 32, 136 - 17 - 16, 0);
        return finish(acc, len);
    }

    private static void accumulate512(long[] acc, byte[] in, int i, int s) {
        for (int k = 0; k < 8; k++) {
            long data = le64(in, i + 8 * k);
            long key = data ^ le64(SECRET, s + 8 * k);
            acc[k ^ 1] += data;
            acc[k] += (key & 0xffffffffL) * (key >>> 32);
        }
    }

    private static long[] hashLong(byte[] in, int len) {
        long[] acc = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
        int blocks = (len - 1) / BLOCK;
        for (int n = 0; n < blocks; n++) {
            for (int s = 0; s < STRIPES_PER_BLOCK; s++) {
                accumulate512(acc, in, n * BLOCK + s * STRIPE, s * RATE);
            }
            int sec = SECRET.length - STRIPE;
            for (int k = 0; k < 8; k++) {
                long a = acc[k];
                a ^= a >>> 47;
                a ^= le64(SECRET, sec + 8 * k);
                acc[k] = a * P32_1;
            }
        }
        int stripes = ((len - 1) - BLOCK * blocks) / STRIPE;
        for (int s = 0; s < stripes; s++) {
            accumulate512(acc, in, blocks * BLOCK + s * STRIPE, s * RATE);
        }
        accumulate512(acc, in, len - STRIPE, SECRET.length - STRIPE - 7);
        long lo = merge(acc, 11, (long) len * P64_1);
        long hi = merge(acc, SECRET.length - STRIPE - 11, ~((long) len * P64_2));
        return new long[] {lo, hi};
    }

    private static long merge(long[] acc, int s, long start) {
        long r = start;
        for (int k = 0; k < 4; k++) {
            r += fold64(acc[2 * k] ^ le64(SECRET, s + 16 * k), acc[2 * k + 1] ^ le64(SECRET, s + 16 * k + 8));
        }
        return avalanche3(r);
    }
}
