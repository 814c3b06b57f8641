package io.pegaflow.server;

import java.nio.file.Path;

/**
 * How the server keeps tenants apart beyond the token (docs/security.md), validated here.
 * {@code operatorTokenFile}: the secret Shutdown needs ({@code --operator-token-file}; null:
 * a new one in {@code <pool>.operator-token}, mode 0600).
 */
public record Tenancy(Path operatorTokenFile) {
    public static final Tenancy DEFAULTS = new Tenancy(null);
}
