package io.pegaflow.client;

/** The one version string client and server compare at registration (they must be equal). */
public final class Version {
    public static final String VERSION = "0.1.0";

    private Version() {}
}
