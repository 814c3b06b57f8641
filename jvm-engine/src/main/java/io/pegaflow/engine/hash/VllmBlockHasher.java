package io.pegaflow.engine.hash;

import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Locale;

/**
 * vLLM's prefix-caching block hash ({@code vllm.v1.core.kv_cache_utils.hash_block_tokens}), so
 * an engine that is not vLLM computes the same keys for the same tokens and shares a namespace
 * with vLLM instances. Block {@code i} of a token list hashes the tuple {@code (hash of block
 * i-1, tokens of block i, None)}, block 0's parent being {@code NONE_HASH}, the hash of the
 * seed string. Full blocks only; no extra keys (LoRA, multimodal inputs and cache salt add
 * keys: such requests must be hashed by vLLM itself).
 *
 * <p>Algorithms, as vLLM's {@code --prefix-caching-hash-algo}: {@code sha256} (SHA-256 of
 * the pickle, protocol 5), {@code sha256_cbor} (SHA-256 of canonical CBOR), {@code xxhash}
 * (XXH3-128 of the pickle), {@code xxhash_cbor} (XXH3-128 of canonical CBOR). The seed is
 * {@code PYTHONHASHSEED} as vLLM's processes have it; without one vLLM uses {@code
 * "vllm-none-hash"} for the SHA-256 algorithms and a random seed for the xxhash ones, which
 * nothing else can reproduce, so those need a seed here.
 */
public final class VllmBlockHasher {
    /** The seed vLLM's SHA-256 algorithms use when PYTHONHASHSEED is not set. */
    public static final String DEFAULT_SEED = "vllm-none-hash";
    /** Most tokens one call hashes (4M: the most hashes one call may carry, at 16 tokens a block). */
    public static final int MAX_TOKENS = Limits.MAX_HASHES_PER_CALL * 16;

    public enum Algorithm {
        SHA256(false, true), SHA256_CBOR(true, true), XXHASH(false, false), XXHASH_CBOR(true, false);

        final boolean cbor;
        final boolean sha;

        Algorithm(boolean cbor, boolean sha) {
            this.cbor = cbor;
            this.sha = sha;
        }

        /** vLLM's name: sha256, sha256_cbor, xxhash, xxhash_cbor. */
        public String vllmName() {
            return name().toLowerCase(Locale.ROOT);
        }

        public static Algorithm of(String name) {
            for (Algorithm a : values()) {
                if (a.vllmName().equals(name)) {
                    return a;
                }
            }
            throw new InvalidArgumentException("prefix-caching hash algorithm '" + name
                    + "'; expected sha256, sha256_cbor, xxhash or xxhash_cbor (vLLM's --prefix-caching-hash-algo)");
        }
    }

    private final Algorithm algorithm;
    private final byte[] noneHash;

    /**
     * @param seed PYTHONHASHSEED of the vLLM processes to agree with; null: vLLM's default,
     *             which only the SHA-256 algorithms have
     */
    public VllmBlockHasher(Algorithm algorithm, String seed) {
        if (algorithm == null) {
            throw new InvalidArgumentException("hash algorithm is null; expected sha256, sha256_cbor, xxhash or xxhash_cbor");
        }
        if (seed == null && !algorithm.sha) {
            throw new InvalidArgumentException("hash algorithm " + algorithm.vllmName() + " without a seed: vLLM then "
                    + "draws a random one per process, which no other process can reproduce; expected the "
                    + "PYTHONHASHSEED every vLLM process of the namespace runs with");
        }
        this.algorithm = algorithm;
        String s = seed == null ? DEFAULT_SEED : seed;
        this.noneHash = digest(algorithm.cbor ? Cbor.text(s) : Pickle.text(s));
    }

    public Algorithm algorithm() {
        return algorithm;
    }

    /** vLLM's {@code NONE_HASH}: the parent of a request's first block. */
    public byte[] noneHash() {
        return noneHash.clone();
    }

    /** The hash of one block: {@code tokens[from, to)} after the block hashed {@code parent} (null: the first). */
    public byte[] block(byte[] parent, int[] tokens, int from, int to) {
        byte[] p = parent == null || parent.length == 0 ? noneHash : parent;
        return digest(algorithm.cbor ? Cbor.blockKey(p, tokens, from, to) : Pickle.blockKey(p, tokens, from, to));
    }

    /**
     * The hashes of every full block of {@code tokens} in blocks of {@code blockSize}, chained
     * from {@code parent} (null: the first block of a request), packed.
     */
    public BlockHashes chain(byte[] parent, int[] tokens, int blockSize) {
        if (blockSize < 1) {
            throw new InvalidArgumentException("block size " + blockSize + "; expected >= 1 token");
        }
        if (tokens.length > MAX_TOKENS) {
            throw new InvalidArgumentException(tokens.length + " tokens in one call; expected at most " + MAX_TOKENS);
        }
        int n = tokens.length / blockSize;
        int len = algorithm.sha ? 32 : 16;
        byte[] packed = new byte[n * len];
        byte[] prev = parent;
        for (int i = 0; i < n; i++) {
            prev = block(prev, tokens, i * blockSize, (i + 1) * blockSize);
            System.arraycopy(prev, 0, packed, i * len, len);
        }
        return n == 0 ? BlockHashes.EMPTY : new BlockHashes(packed, len);
    }

    private byte[] digest(Bytes serialized) {
        if (!algorithm.sha) {
            return Xxh3.digest128(serialized.array(), serialized.size());
        }
        MessageDigest sha = SHA256.get();
        sha.update(serialized.array(), 0, serialized.size());
        return sha.digest(); // and resets it for the next block
    }

    /**
     * One SHA-256 per thread: {@code MessageDigest.getInstance} looks the provider up on every
     * call, which cost more than the digest of one block's ~100 bytes.
     */
    private static final ThreadLocal<MessageDigest> SHA256 = ThreadLocal.withInitial(() -> {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java runtime has SHA-256", e);
        }
    });

    /**
     * A growable byte buffer without {@code ByteArrayOutputStream}'s lock on every write: the
     * serializations below write a block's key a byte or two at a time (1,024 blocks of a 16K
     * prompt at a request's first lookup, inside vLLM's scheduling step).
     */
    static final class Bytes {
        private byte[] a;
        private int n;

        Bytes() {
            this(64);
        }

        Bytes(int capacity) {
            a = new byte[Math.max(16, capacity)];
        }

        void write(int b) {
            if (n == a.length) {
                a = java.util.Arrays.copyOf(a, a.length * 2);
            }
            a[n++] = (byte) b;
        }

        void writeBytes(byte[] b) {
            write(b, 0, b.length);
        }

        void write(byte[] b, int off, int len) {
            if (n + len > a.length) {
                a = java.util.Arrays.copyOf(a, Math.max(a.length * 2, n + len));
            }
            System.arraycopy(b, off, a, n, len);
            n += len;
        }

        int size() {
            return n;
        }

        /** The backing array: bytes {@code [0, size())} are the content. */
        byte[] array() {
            return a;
        }
    }


    /** The most tokens a tail key covers: a partial block is shorter than any block size vLLM takes. */
    public static final int MAX_TAIL_TOKENS = 1 << 16;

    /**
     * The key of a prompt's partial last block (PegaFlow's tail-block flow, docs/cluster.md,
     * P/D): the first {@code parent.length} bytes of SHA-256 over {@code "pegaflow-tail\0"},
     * the last full block's key {@code parent}, and the tail's token ids as 32-bit
     * little-endian integers. The same on the prefill and the decode side, whatever the hash
     * algorithm of the full blocks (their key only seeds it); never equal to a full block's key
     * in practice (another prefix, another digest input).
     */
    public static byte[] tailKey(byte[] parent, int[] tokens) {
        if (parent == null || parent.length == 0 || parent.length > 32) {
            throw new InvalidArgumentException("tail key parent of " + (parent == null ? "no" : parent.length)
                    + " bytes; expected the last full block's key, 1 to 32 bytes");
        }
        if (tokens == null || tokens.length == 0 || tokens.length > MAX_TAIL_TOKENS) {
            throw new InvalidArgumentException("tail of " + (tokens == null ? "no" : tokens.length) + " tokens; expected 1 to "
                    + MAX_TAIL_TOKENS);
        }
        try {
            MessageDigest sha = MessageDigest.getInstance("SHA-256");
            sha.update("pegaflow-tail\0".getBytes(StandardCharsets.US_ASCII));
            sha.update(parent);
            byte[] le = new byte[4 * tokens.length];
            for (int i = 0; i < tokens.length; i++) {
                int t = tokens[i];
                le[4 * i] = (byte) t;
                le[4 * i + 1] = (byte) (t >>> 8);
                le[4 * i + 2] = (byte) (t >>> 16);
                le[4 * i + 3] = (byte) (t >>> 24);
            }
            sha.update(le);
            return java.util.Arrays.copyOf(sha.digest(), parent.length);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 missing from this JVM", e);
        }
    }
    /** Canonical CBOR (cbor2's {@code dumps(..., canonical=True)}) of what vLLM hashes. */
    static final class Cbor {
        private Cbor() {}

        static Bytes text(String s) {
            Bytes out = new Bytes();
            byte[] b = s.getBytes(StandardCharsets.UTF_8);
            head(out, 3, b.length);
            out.writeBytes(b);
            return out;
        }

        /** {@code [parent bytes, [token, ...], null]}. */
        static Bytes blockKey(byte[] parent, int[] tokens, int from, int to) {
            Bytes out = new Bytes(16 + parent.length + 5 * (to - from));
            head(out, 4, 3);
            head(out, 2, parent.length);
            out.writeBytes(parent);
            head(out, 4, to - from);
            for (int i = from; i < to; i++) {
                int t = tokens[i];
                if (t >= 0) {
                    head(out, 0, t);
                } else {
                    head(out, 1, -1L - t);
                }
            }
            out.write(0xf6);
            return out;
        }

        /** A major type's head with the shortest argument encoding. */
        private static void head(Bytes out, int major, long v) {
            int m = major << 5;
            if (v < 24) {
                out.write(m | (int) v);
            } else if (v < 0x100) {
                out.write(m | 24);
                out.write((int) v);
            } else if (v < 0x10000) {
                out.write(m | 25);
                be(out, v, 2);
            } else if (v < 0x100000000L) {
                out.write(m | 26);
                be(out, v, 4);
            } else {
                out.write(m | 27);
                be(out, v, 8);
            }
        }

        private static void be(Bytes out, long v, int n) {
            for (int i = n - 1; i >= 0; i--) {
                out.write((int) (v >>> (8 * i)));
            }
        }
    }

    /**
     * Python's {@code pickle.dumps(..., protocol=5)} of what vLLM hashes, as CPython's C pickler
     * writes it: PROTO 5, then the opcodes in frames of at least 64 KiB (a frame is committed at
     * the first opcode boundary past 64 KiB; a last frame under 4 bytes goes unframed), MEMOIZE
     * after each bytes, str and non-empty tuple.
     */
    static final class Pickle {
        private static final int FRAME_TARGET = 64 * 1024, FRAME_MIN = 4;
        private final Bytes out = new Bytes();
        private Bytes frame = new Bytes();

        private Pickle() {
            out.write(0x80);
            out.write(5);
        }

        static Bytes text(String s) {
            Pickle p = new Pickle();
            byte[] b = s.getBytes(StandardCharsets.UTF_8);
            if (b.length < 0x100) {
                p.frame.write(0x8c); // SHORT_BINUNICODE
                p.frame.write(b.length);
            } else {
                p.frame.write(0x58); // BINUNICODE
                le(p.frame, b.length, 4);
            }
            p.frame.writeBytes(b);
            p.frame.write(0x94); // MEMOIZE
            p.boundary();
            return p.stop();
        }

        /** {@code (parent, tuple(tokens), None)}. */
        static Bytes blockKey(byte[] parent, int[] tokens, int from, int to) {
            Pickle p = new Pickle();
            p.frame.write(0x43); // SHORT_BINBYTES (a hash is at most 64 bytes)
            p.frame.write(parent.length);
            p.frame.writeBytes(parent);
            p.frame.write(0x94);
            p.boundary();
            int n = to - from;
            if (n == 0) {
                p.frame.write(0x29); // EMPTY_TUPLE, not memoized
                p.boundary();
            } else {
                if (n > 3) {
                    p.frame.write(0x28); // MARK (no boundary: CPython checks after whole objects)
                }
                for (int i = from; i < to; i++) {
                    int t = tokens[i];
                    if (t >= 0 && t < 0x100) {
                        p.frame.write(0x4b); // BININT1
                        p.frame.write(t);
                    } else if (t >= 0 && t < 0x10000) {
                        p.frame.write(0x4d); // BININT2
                        le(p.frame, t, 2);
                    } else {
                        p.frame.write(0x4a); // BININT
                        le(p.frame, t, 4);
                    }
                    p.boundary();
                }
                p.frame.write(n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 0x74); // TUPLE1/2/3, TUPLE
                p.frame.write(0x94);
                p.boundary();
            }
            p.frame.write(0x4e); // NONE
            p.boundary();
            p.frame.write(0x87); // TUPLE3
            p.frame.write(0x94);
            p.boundary();
            return p.stop();
        }

        private void boundary() {
            if (frame.size() >= FRAME_TARGET) {
                commit();
            }
        }

        private void commit() {
            if (frame.size() >= FRAME_MIN) {
                out.write(0x95); // FRAME
                le(out, frame.size(), 8);
            }
            out.write(frame.array(), 0, frame.size());
            frame = new Bytes();
        }

        private Bytes stop() {
            frame.write(0x2e); // STOP
            commit();
            return out;
        }

        private static void le(Bytes o, long v, int n) {
            for (int i = 0; i < n; i++) {
                o.write((int) (v >>> (8 * i)));
            }
        }
    }
}
