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
    /** Clients one instance keeps as members (its workers' processes and a few more). */
    static final int MAX_MEMBERS = io.pegaflow.engine.Limits.MAX_WORLD_SIZE + 64;

    private static final SecureRandom RANDOM = new SecureRandom();

    /** An instance's members, join secret, the tenant it counts against, and which registration it is. */
    private record Members(Set<String> clients, byte[] secret, String tenant, long generation) {
        boolean admits(Caller caller) {
            return (!caller.client().isEmpty() && clients.contains(caller.client()))
                    || (caller.joinSecret() != null && MessageDigest.isEqual(caller.joinSecret(), secret));
        }
    }

    /** What RegisterInstance did: the instance's join secret, and whether it created the instance (then its generation). */
    record Registration(byte[] secret, boolean created, long generation) {}

    private final Map<String, Members> instances = new ConcurrentHashMap<>();
    private final int maxInstances;
    private final int maxPerTenant;
    // --- guarded by this ---
    private final Map<String, Integer> perTenant = new java.util.HashMap<>();
    private long generations;

    Tenants(int maxInstances, int maxPerTenant) {
        this.maxInstances = maxInstances;
        this.maxPerTenant = maxPerTenant;
    }

    /** With {@link Tenancy#DEFAULTS}' instance quotas. */
    Tenants() {
        this(Tenancy.DEFAULTS.maxInstances(), Tenancy.DEFAULTS.maxInstancesPerTenant());
    }

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
     * the store has the instance already. A new instance counts against the caller's tenant
     * (refused over {@code --max-instances-per-tenant} or {@code --max-instances}, before the
     * store sees it) and gets the caller as member and the caller's join secret (or a random
     * one); an existing one admits a member or the holder of its secret, who becomes a member.
     * The answer's secret is empty for an instance registered on the store directly, which
     * nothing binds.
     */
    synchronized Registration register(String instanceId, Caller caller, boolean exists, Runnable inStore) {
        Members m = instances.get(instanceId);
        if (exists) {
            if (m == null) {
                inStore.run();
                return new Registration(new byte[0], false, 0);
            }
            admit(m, instanceId, caller, "registering");
            inStore.run();
            join(m, caller);
            return new Registration(m.secret.clone(), false, m.generation);
        }
        String tenant = caller.tenant();
        int mine = perTenant.getOrDefault(tenant, 0);
        if (mine >= maxPerTenant) {
            throw new io.pegaflow.engine.QuotaExceededException("registering instance '" + instanceId + "': this tenant has "
                    + mine + " instances registered, the most one may (--max-instances-per-tenant); unregister one first");
        }
        if (instances.size() >= maxInstances) {
            throw new io.pegaflow.engine.QuotaExceededException("registering instance '" + instanceId + "': "
                    + instances.size() + " instances are registered, the most the server holds (--max-instances); try again later");
        }
        inStore.run();
        byte[] secret = caller.joinSecret();
        if (secret == null) {
            secret = new byte[MIN_SECRET];
            RANDOM.nextBytes(secret);
        }
        Members created = new Members(ConcurrentHashMap.newKeySet(), secret.clone(), tenant, ++generations);
        join(created, caller);
        Members stale = instances.put(instanceId, created);
        if (stale != null) {
            released(stale); // the store dropped it on its own (never through this service)
        }
        perTenant.merge(tenant, 1, Integer::sum);
        return new Registration(secret.clone(), true, created.generation);
    }

    /**
     * Refuses {@code what} unless {@code caller} acts for the instance: a member, or the
     * holder of its join secret (who is admitted on every call without being kept). Unknown
     * instances pass (the store says so).
     */
    void require(String instanceId, Caller caller, String what) {
        Members m = instances.get(instanceId);
        if (m != null) {
            admit(m, instanceId, caller, what);
        }
    }

    /** As {@link #require}, and the caller becomes a member (RegisterWorker: a TP rank's process joins). */
    void join(String instanceId, Caller caller, String what) {
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
        if (!caller.client().isEmpty() && m.clients.size() < MAX_MEMBERS) {
            m.clients.add(caller.client()); // beyond the cap a secret holder is still admitted, call by call
        }
    }

    /** Unregisters the instance: {@code inStore} (the store's unregistration), then its members and secret go. */
    synchronized void unregister(String instanceId, Runnable inStore) {
        try {
            inStore.run();
        } finally {
            Members m = instances.remove(instanceId);
            if (m != null) {
                released(m);
            }
        }
    }

    /**
     * Unregisters the instance through {@code inStore} if it is still registration
     * {@code generation} (not unregistered and registered again meanwhile); false otherwise.
     */
    synchronized boolean unregisterIf(String instanceId, long generation, Runnable inStore) {
        Members m = instances.get(instanceId);
        if (m == null || m.generation != generation) {
            return false;
        }
        unregister(instanceId, inStore);
        return true;
    }

    private void released(Members m) {
        perTenant.computeIfPresent(m.tenant, (k, n) -> n <= 1 ? null : n - 1);
    }

    /** Each tenant's instances (/metrics). */
    /** Owners of the store's pool share, by tenant: a small index each tenant keeps ({@link #ownerOf}). */
    private final Map<String, Integer> owners = new java.util.HashMap<>();
    /** Tenants given an owner at most; later ones count against no share (-1). */
    static final int MAX_OWNERS = 1 << 16;

    /**
     * The index {@code tenant}'s saves are counted under in the store ({@code
     * LocalStore.assignOwner}, {@code Quotas.tenantPoolBytes}): the same for every instance of
     * the tenant, kept while the server runs (its blocks outlive its instances); -1 past
     * {@link #MAX_OWNERS} tenants.
     */
    synchronized int ownerOf(String tenant) {
        Integer o = owners.get(tenant);
        if (o == null) {
            if (owners.size() >= MAX_OWNERS) {
                return -1;
            }
            o = owners.size();
            owners.put(tenant, o);
        }
        return o;
    }

    /** The tenant of each owner index handed out ({@link #ownerOf}). */
    synchronized Map<Integer, String> ownerTenants() {
        Map<Integer, String> out = new java.util.HashMap<>();
        owners.forEach((t, o) -> out.put(o, t));
        return out;
    }

    synchronized Map<String, java.util.List<String>> byTenant() {
        Map<String, java.util.List<String>> out = new java.util.TreeMap<>();
        instances.forEach((id, m) -> out.computeIfAbsent(m.tenant, k -> new java.util.ArrayList<>()).add(id));
        return out;
    }
}
