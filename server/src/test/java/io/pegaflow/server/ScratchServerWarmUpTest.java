package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;

import io.pegaflow.connector.LookupWarmUp;
import io.pegaflow.engine.ScratchServers;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The connector's warm-up in server mode runs its rounds as a client of a scratch server of its
 * own (the provider this module registers), answers every hit and copies every loaded block as
 * the embedded warm-up does, and leaves no file behind; a server that cannot start leaves the
 * embedded warm-up.
 */
class ScratchServerWarmUpTest {
    private static Set<Path> warmUpDirs() throws IOException {
        try (Stream<Path> s = Files.list(Path.of(System.getProperty("java.io.tmpdir")))) {
            return s.filter(p -> p.getFileName().toString().startsWith("pegaflow-warm-up-")).collect(Collectors.toSet());
        }
    }

    private static void assertClean(LookupWarmUp.Result r) {
        assertThat(r.expectedHitTokens()).isPositive();
        assertThat(r.hitTokens()).isEqualTo(r.expectedHitTokens());
        assertThat(r.missTokens()).isZero();
        assertThat(r.loads()).isEqualTo(r.rounds() - r.rounds() / 3);
        assertThat(r.loadFailures()).isZero();
        assertThat(r.expectedLoadedBlocks()).isPositive();
        assertThat(r.loadedBlocks()).isEqualTo(r.expectedLoadedBlocks());
        assertThat(r.lookupFailures()).isZero();
        assertThat(r.contractViolations()).isZero();
        assertThat(r.tracked()).isZero();
    }

    @Test
    void theServerModeWarmUpRunsThroughAScratchServersClientAndLeavesNothing() throws IOException {
        assertThat(ScratchServers.provided()).isInstanceOf(ScratchServer.class);
        Set<Path> before = warmUpDirs();

        LookupWarmUp.Result r = LookupWarmUp.run(16, 30, Long.MAX_VALUE, 0, new ScratchServer());

        assertThat(r.throughServer()).as("a client of the scratch server").isTrue();
        assertThat(r.rounds()).isEqualTo(30);
        assertClean(r);
        assertThat(warmUpDirs()).as("its pool file, token and socket removed").isEqualTo(before);
    }

    /** In vLLM's log a scratch server's line about its pool would read as the process's own pool. */
    @Test
    void aScratchServerLogsNothingBelowAWarning() throws IOException {
        java.util.logging.Logger pegaflow = java.util.logging.Logger.getLogger("io.pegaflow");
        java.util.List<java.util.logging.LogRecord> records = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.logging.Handler capture = new java.util.logging.Handler() {
            @Override
            public void publish(java.util.logging.LogRecord r) {
                if (r.getLevel().intValue() >= java.util.logging.Level.INFO.intValue()) {
                    records.add(r);
                }
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        pegaflow.addHandler(capture);
        try (ScratchServers.Client c = new ScratchServer().open(1 << 20, p -> new io.pegaflow.engine.transfer.HostTransferEngine(p, 1))) {
            assertThat(c.engine().localStore()).as("a server's client").isNull();
        } finally {
            pegaflow.removeHandler(capture);
        }
        assertThat(records).extracting(java.util.logging.LogRecord::getMessage).isEmpty();
        assertThat(java.util.logging.Logger.getLogger(PegaflowServer.class.getName()).getLevel())
                .as("the level it found, restored").isNull();
    }

    @Test
    void aScratchServerThatCannotStartLeavesTheEmbeddedWarmUp() {
        LookupWarmUp.Result r = LookupWarmUp.run(16, 6, Long.MAX_VALUE, 0, (bytes, transfer) -> {
            throw new IOException("no loopback port");
        });

        assertThat(r.throughServer()).isFalse();
        assertThat(r.rounds()).isEqualTo(6);
        assertClean(r);
    }
}
