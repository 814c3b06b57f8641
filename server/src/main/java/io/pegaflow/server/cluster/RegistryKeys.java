package io.pegaflow.server.cluster;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The registry's key layout (docs/cluster.md, "Registry layout"): node keys {@code pf:node:<i>}
 * and block keys {@code "pf" + 6 bytes of SHA-256(namespace) + hash}. Shared by membership,
 * lookup and the updates sent; any thread (a namespace's tag is computed once and cached).
 */
final class RegistryKeys {
    static final byte[] NODE_PREFIX = "pf:node:".getBytes(StandardCharsets.US_ASCII);

    private final Map<String, byte[]> nsTags = new ConcurrentHashMap<>();

    static byte[] nodeKey(int i) {
        byte[] n = Integer.toString(i).getBytes(StandardCharsets.US_ASCII);
        byte[] k = Arrays.copyOf(NODE_PREFIX, NODE_PREFIX.length + n.length);
        System.arraycopy(n, 0, k, NODE_PREFIX.length, n.length);
        return k;
    }

    /** The node keys of indices 0 .. {@code maxNodes - 1}. */
    static byte[][] allNodeKeys(int maxNodes) {
        byte[][] keys = new byte[maxNodes][];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = nodeKey(i);
        }
        return keys;
    }

    /** The key of a whole {@code hash}. */
    byte[] key(String namespace, byte[] hash) {
        return key(namespace, hash, 0, hash.length);
    }

    /** {@code "pf"}, the namespace's 6-byte tag, then the hash at {@code buf[off, off + len)}. */
    byte[] key(String namespace, byte[] buf, int off, int len) {
        byte[] tag = nsTags.computeIfAbsent(namespace, RegistryKeys::tag);
        byte[] k = new byte[2 + tag.length + len];
        k[0] = 'p';
        k[1] = 'f';
        System.arraycopy(tag, 0, k, 2, tag.length);
        System.arraycopy(buf, off, k, 2 + tag.length, len);
        return k;
    }

    static byte[] tag(String namespace) {
        try {
            return Arrays.copyOf(MessageDigest.getInstance("SHA-256").digest(namespace.getBytes(StandardCharsets.UTF_8)), 6);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
