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
