package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.engine.logging.Logs;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.logging.Level;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The SLF4J users in the server's jar (Netty, Lettuce, redis-authx) log through the one JUL handler. */
class LogBindingTest {
    @AfterEach
    void restore() {
        Logs.configure(Level.INFO, Logs.Format.TEXT);
    }

    @Test
    void slf4jAndNettyRecordsReachTheOneLineHandler() {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        Logs.configure(Level.INFO, Logs.Format.JSON, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        // bound (slf4j-jdk14), not the NOP fallback that prints "Failed to load class StaticLoggerBinder"
        assertThat(org.slf4j.LoggerFactory.getILoggerFactory().getClass().getName()).isEqualTo("org.slf4j.impl.JDK14LoggerFactory");
        org.slf4j.LoggerFactory.getLogger("io.lettuce.core.Probe").warn("redis {} unreachable", "r1");
        io.netty.util.internal.logging.InternalLoggerFactory.getInstance("io.netty.Probe").warn("netty says");
        String out = bytes.toString(StandardCharsets.UTF_8);
        assertThat(out.lines()).anySatisfy(l -> assertThat(l).contains("\"level\":\"WARN\"", "\"logger\":\"io.lettuce.core.Probe\"",
                "\"msg\":\"redis r1 unreachable\""));
        assertThat(out.lines()).anySatisfy(l -> assertThat(l).contains("\"logger\":\"io.netty.Probe\"", "\"msg\":\"netty says\""));
    }
}
