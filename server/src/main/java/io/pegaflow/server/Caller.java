package io.pegaflow.server;

/**
 * Who sent a call: its client id ("" when it sent none) and the join secret it presented
 * (null: none). Over gRPC from the call's headers ({@link Credentials}); on the local socket
 * from the connection's first frame ({@link LocalSocketServer}). {@link Tenants} decides
 * what it may act for.
 */
record Caller(String client, byte[] joinSecret) {
    static final Caller NOBODY = new Caller("", null);

    /** Longest client id accepted (a client draws 32 hex characters). */
    static final int MAX_CLIENT_ID = 64;

    Caller {
        client = client == null ? "" : client;
        if (client.length() > MAX_CLIENT_ID || !client.chars().allMatch(c -> c > 0x20 && c < 0x7f)) {
            throw new io.pegaflow.engine.InvalidArgumentException("client id of " + client.length()
                    + " characters; expected at most " + MAX_CLIENT_ID + " printable ASCII characters (32 hex digits)");
        }
        joinSecret = Tenants.checkSecret(joinSecret);
    }

    /**
     * The tenant this caller counts against ({@link Tenancy}'s quotas, {@code /metrics}): the
     * processes of one launch present one join secret and are one tenant; a client without one
     * is a tenant of its own. A digest (16 hex digits of SHA-256), never the secret or the id.
     */
    String tenant() {
        if (joinSecret != null) {
            return "s" + digest(joinSecret);
        }
        return client.isEmpty() ? "anonymous" : "c" + digest(client.getBytes(java.nio.charset.StandardCharsets.US_ASCII));
    }

    private static String digest(byte[] b) {
        try {
            return java.util.HexFormat.of().formatHex(java.security.MessageDigest.getInstance("SHA-256").digest(b), 0, 8);
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A caller from the wire form: a join secret as hex ("" or null: none). */
    static Caller of(String client, String joinSecretHex) {
        byte[] secret = null;
        if (joinSecretHex != null && !joinSecretHex.isEmpty()) {
            if (joinSecretHex.length() > 2 * Tenants.MAX_SECRET) {
                throw new io.pegaflow.engine.InvalidArgumentException("join secret of " + joinSecretHex.length()
                        + " hex digits; expected " + 2 * Tenants.MIN_SECRET + ".." + 2 * Tenants.MAX_SECRET);
            }
            try {
                secret = java.util.HexFormat.of().parseHex(joinSecretHex);
            } catch (IllegalArgumentException e) {
                throw new io.pegaflow.engine.InvalidArgumentException("join secret is not hex digits");
            }
        }
        return new Caller(client, secret);
    }
}
