package io.pegaflow.server;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PermissionDeniedException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Which clients act for which instance. The client that creates an instance is its first
 * member; the instance gets a join secret (the one the creator proposed, or 16 random bytes)
 * that is handed back to members only. Another client becomes a member by presenting that
 * secret (at RegisterInstance, RegisterWorker, or on any call naming the instance: a
 * scheduler process that registers nothing itself). Every call that names an instance goes
 * through {@link #require}: a non-member without the secret is refused before anything
 * changes, so holding the server's token is not enough to save, end, query, load, release,
 * unregister or hold the session of another tenant's instance.
 *
 * <p>Client ids are 128 random bits each client process draws, never shown to other
 * clients. An instance registered on the store directly (not through this service) has no
 * entry and is not checked. Thread-safe; {@link #register} is atomic with the store's
 * registration and {@link #unregister} with the store's unregistration.
 */
final class Tenants {
    /** Bounds of a join secret, in bytes. */
    static final int MIN_SECRET = 16;
    static final int MAX_SECRET = 64;

    private static final SecureRandom RANDOM = new SecureRandom();

    /** An instance's members and join secret. */
    private record Members(Set<String> clients, byte[] secret) {
        boolean admits(Caller caller) {
            return (!caller.client().isEmpty() && clients.contains(caller.client()))
                    || (caller.joinSecret() != null && MessageDigest.isEqual(caller.joinSecret(), secret));
        }
    }

    private final Map<String, Members> instances = new ConcurrentHashMap<>();

    /** Refuses a join secret outside {@link #MIN_SECRET}..{@link #MAX_SECRET} bytes (null and empty: none). */
    static byte[] checkSecret(byte[] secret) {
        if (secret == null || secret.length == 0) {
            return null;
        }
        if (secret.length < MIN_SECRET || secret.length > MAX_SECRET) {
            throw new InvalidArgumentException("join secret of " + secret.length + " bytes; expected " + MIN_SECRET + ".."
                    + MAX_SECRET);
        }
        return secret;
    }

    /**
     * RegisterInstance by {@code caller}, around the store's registration {@code inStore}
     * (which validates the spec; run only once the caller may register). {@code exists}:
     * the store has the instance already. A new instance gets the caller as member and the
     * caller's join secret (or a random one); an existing one admits a member or the holder
     * of its secret, who becomes a member. Returns the instance's join secret (empty for an
     * instance registered on the store directly, which nothing binds).
     */
    synchronized byte[] register(String instanceId, Caller caller, boolean exists, Runnable inStore) {
        Members m = instances.get(instanceId);
        if (exists) {
            if (m == null) {
                inStore.run();
                return new byte[0];
            }
            admit(m, instanceId, caller, "registering");
            inStore.run();
            join(m, caller);
            return m.secret.clone();
        }
        inStore.run();
        byte[] secret = caller.joinSecret();
        if (secret == null) {
            secret = new byte[MIN_SECRET];
            RANDOM.nextBytes(secret);
        }
        Set<String> clients = ConcurrentHashMap.newKeySet();
        join(new Members(clients, secret), caller);
        instances.put(instanceId, new Members(clients, secret.clone()));
        return secret.clone();
    }

    /**
     * Refuses {@code what} unless {@code caller} acts for the instance; a caller admitted by
     * the secret becomes a member. Unknown instances pass (the store says so).
     */
    void require(String instanceId, Caller caller, String what) {
        Members m = instances.get(instanceId);
        if (m != null) {
            admit(m, instanceId, caller, what);
            join(m, caller);
        }
    }

    private static void admit(Members m, String instanceId, Caller caller, String what) {
        if (!m.admits(caller)) {
            throw new PermissionDeniedException(what + " of instance '" + instanceId + "' refused: this client did not "
                    + "register it and presented " + (caller.joinSecret() == null ? "no" : "another") + " join secret");
        }
    }

    private static void join(Members m, Caller caller) {
        if (!caller.client().isEmpty()) {
            m.clients.add(caller.client());
        }
    }

    /** Unregisters the instance: {@code inStore} (the store's unregistration), then its members and secret go. */
    synchronized void unregister(String instanceId, Runnable inStore) {
        try {
            inStore.run();
        } finally {
            instances.remove(instanceId);
        }
    }
}
