package io.pegaflow.engine.logging;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class LogsTest {
    private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();

    @AfterEach
    void restore() {
        Logs.configure(Level.INFO, Logs.Format.TEXT);
    }

    private String[] lines() {
        return bytes.toString(StandardCharsets.UTF_8).split("\n", -1);
    }

    @Test
    void textIsOneLinePerRecordEvenWithLineBreaksAndAStackTrace() {
        Logs.configure(Level.INFO, Logs.Format.TEXT, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        Logger log = Logger.getLogger("io.pegaflow.test");
        log.info("instance 'a\nFAKE 2026-01-01T00:00:00Z ERROR forged' registered");
        log.log(Level.WARNING, "copy failed", new IllegalStateException("boom\r\nsecond"));
        String[] lines = lines();
        assertThat(lines).hasSize(3); // two records and the empty string after the last newline
        assertThat(lines[2]).isEmpty();
        assertThat(lines[0]).matches("\\d{4}-\\d\\d-\\d\\dT\\S+Z INFO \\[[^]]+] io\\.pegaflow\\.test: instance 'a\\\\nFAKE .*");
        assertThat(lines[1]).contains(" WARN ").contains("copy failed | java.lang.IllegalStateException: boom\\r\\nsecond\\n")
                .contains("\\n\tat io.pegaflow.engine.logging.LogsTest");
    }

    @Test
    void jsonIsOneObjectPerLineWithEveryCharacterEscaped() {
        Logs.configure(Level.FINE, Logs.Format.JSON, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        Logger log = Logger.getLogger("io.pegaflow.test");
        log.fine("quote \" backslash \\ nl \n nul \u0000 done");
        log.log(Level.SEVERE, "failed", new RuntimeException("x"));
        String[] lines = lines();
        assertThat(lines).hasSize(3);
        assertThat(lines[0]).startsWith("{\"ts\":\"").endsWith("}")
                .contains("\"level\":\"DEBUG\"", "\"logger\":\"io.pegaflow.test\"",
                        "\"msg\":\"quote \\\" backslash \\\\ nl \\n nul \\u0000 done\"");
        assertThat(lines[1]).contains("\"level\":\"ERROR\"", "\"exception\":\"java.lang.RuntimeException: x\\n\\tat ");
    }

    @Test
    void pegaflowLogsAtTheLevelOthersAtInfoUnlessCoarser() {
        Logs.configure(Level.FINE, Logs.Format.TEXT, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        Logger.getLogger("io.pegaflow.x").fine("ours");
        Logger.getLogger("io.grpc.netty.x").fine("per-frame");
        Logger.getLogger("io.grpc.netty.x").info("theirs");
        assertThat(bytes.toString(StandardCharsets.UTF_8)).contains("ours", "theirs").doesNotContain("per-frame");
        bytes.reset();
        Logs.configure(Level.WARNING, Logs.Format.TEXT, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        Logger.getLogger("io.pegaflow.x").info("ours");
        Logger.getLogger("io.grpc.netty.x").info("theirs");
        assertThat(bytes.toString(StandardCharsets.UTF_8)).isEmpty();
    }

    @Test
    void aValueOutsideTheChoicesNamesTheFlag() {
        assertThatThrownBy(() -> Logs.configure("loud", "text")).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("--log-level 'loud'");
        assertThatThrownBy(() -> Logs.configure("info", "xml")).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("--log-format 'xml'");
        assertThat(Logs.level("DEBUG")).isEqualTo(Level.FINE);
    }
}
