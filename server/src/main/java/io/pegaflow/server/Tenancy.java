package io.pegaflow.server;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.store.Quotas;
import java.nio.file.Path;
import java.time.Duration;

/**
 * How the server keeps tenants apart beyond the token (docs/security.md), validated here. A
 * tenant is what {@link Caller#tenant} says: the processes presenting one join secret (one
 * vLLM launch), or a client without one.
 *
 * @param operatorTokenFile     the secret Shutdown needs ({@code --operator-token-file}; null: a new
 *                              one in {@code <pool>.operator-token}, mode 0600)
 * @param maxInstances          instances registered at once, over all tenants ({@code --max-instances})
 * @param maxInstancesPerTenant instances one tenant may have registered at once
 * @param unsessionedTtl        how long an instance whose clients never opened a liveness session
 *                              stays registered ({@code --unsessioned-instance-ttl-secs})
 * @param maxCallsPerTenant     gRPC calls in flight (liveness sessions aside), and apart from them
 *                              local-socket connections, per tenant ({@code --max-calls-per-tenant});
 *                              below the socket's 64 connections, so one tenant never holds them all
 * @param quotas                what each instance may hold in the store ({@link Quotas})
 */
public record Tenancy(Path operatorTokenFile, int maxInstances, int maxInstancesPerTenant, Duration unsessionedTtl,
        int maxCallsPerTenant, Quotas quotas) {
    public static final Tenancy DEFAULTS = new Tenancy(null, 4096, 256, Duration.ofSeconds(60), 48, Quotas.DEFAULTS);

    public Tenancy {
        if (maxInstances < 1 || maxInstancesPerTenant < 1 || maxInstancesPerTenant > maxInstances) {
            throw new InvalidArgumentException("--max-instances " + maxInstances + ", --max-instances-per-tenant "
                    + maxInstancesPerTenant + "; expected 1 <= per tenant <= total");
        }
        if (unsessionedTtl == null || unsessionedTtl.isNegative() || unsessionedTtl.isZero()) {
            throw new InvalidArgumentException("--unsessioned-instance-ttl-secs " + unsessionedTtl + "; expected a positive duration");
        }
        if (maxCallsPerTenant < 1) {
            throw new InvalidArgumentException("--max-calls-per-tenant " + maxCallsPerTenant + "; expected >= 1");
        }
        if (quotas == null) {
            throw new InvalidArgumentException("quotas is null; expected Quotas.DEFAULTS or others");
        }
    }

    public Tenancy operatorToken(Path file) {
        return new Tenancy(file, maxInstances, maxInstancesPerTenant, unsessionedTtl, maxCallsPerTenant, quotas);
    }

    public Tenancy instances(int max, int perTenant) {
        return new Tenancy(operatorTokenFile, max, perTenant, unsessionedTtl, maxCallsPerTenant, quotas);
    }

    public Tenancy unsessioned(Duration ttl) {
        return new Tenancy(operatorTokenFile, maxInstances, maxInstancesPerTenant, ttl, maxCallsPerTenant, quotas);
    }

    public Tenancy calls(int perTenant) {
        return new Tenancy(operatorTokenFile, maxInstances, maxInstancesPerTenant, unsessionedTtl, perTenant, quotas);
    }

    public Tenancy quotas(Quotas q) {
        return new Tenancy(operatorTokenFile, maxInstances, maxInstancesPerTenant, unsessionedTtl, maxCallsPerTenant, q);
    }
}
