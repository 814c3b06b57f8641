package io.pegaflow.server;

import io.pegaflow.engine.InvalidArgumentException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

/** Secrets given as files: the server's token (security.md) and the cluster's (cluster.md). */
public final class Secrets {
    private Secrets() {}

    /** The file's text, trimmed, as UTF-8 bytes: 16..4096 characters, else an error naming {@code what}. */
    public static byte[] read(Path file, String what) throws IOException {
        String text = Files.readString(file, StandardCharsets.UTF_8).trim();
        if (text.length() < 16 || text.length() > 4096) {
            throw new InvalidArgumentException(what + " " + file + " holds " + text.length()
                    + " characters; expected a secret of 16..4096");
        }
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
