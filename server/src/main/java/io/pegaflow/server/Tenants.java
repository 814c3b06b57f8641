package io.pegaflow.server;

import io.pegaflow.engine.PermissionDeniedException;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Which clients act for which instance: the client that registered an instance first, and
 * each client that registered one of its workers (TP ranks live in several processes). Only
 * they may unregister it or hold its liveness session, so another tenant cannot get an
 * instance dropped by opening and cancelling a session under its id. Client ids are 128
 * random bits each client process draws, never shown to other clients.
 */
final class Tenants {
    private final Map<String, Set<String>> members = new ConcurrentHashMap<>();

    /** {@code client} created the instance (it was not registered before its call). */
    void created(String instanceId, String client) {
        Set<String> set = ConcurrentHashMap.newKeySet();
        set.add(client);
        members.put(instanceId, set);
    }

    /** {@code client} registered a worker of the instance. */
    void joined(String instanceId, String client) {
        members.computeIfAbsent(instanceId, k -> ConcurrentHashMap.newKeySet()).add(client);
    }

    /** Refuses {@code what} unless {@code client} acts for the instance (unknown instances pass: the store says so). */
    void require(String instanceId, String client, String what) {
        Set<String> set = members.get(instanceId);
        if (set != null && (client.isEmpty() || !set.contains(client))) {
            throw new PermissionDeniedException(what + " of instance '" + instanceId
                    + "' by a client that did not register it; refused");
        }
    }

    void forget(String instanceId) {
        members.remove(instanceId);
    }
}
