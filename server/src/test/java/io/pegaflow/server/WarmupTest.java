package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The server's start-up warm-up runs a worker's calls through a whole scratch server (a client
 * registering over gRPC, its lookups, loads, saves and releases over the local socket), so the
 * compiled code has seen the real server's types, and leaves no file behind.
 */
class WarmupTest {
    private static Set<Path> warmUpDirs() throws IOException {
        try (Stream<Path> s = Files.list(Path.of(System.getProperty("java.io.tmpdir")))) {
            return s.filter(p -> p.getFileName().toString().startsWith("pegaflow-warm-up-")).collect(Collectors.toSet());
        }
    }

    @Test
    void theWarmUpsCallsAreAWorkersAnsweredByAScratchServer() throws IOException {
        Set<Path> before = warmUpDirs();

        Warmup.Result r = Warmup.run(30, Long.MAX_VALUE);

        assertThat(r.rounds()).isEqualTo(30);
        // each round the lookup that begins its load; every other round a plain lookup or a miss
        assertThat(r.queries()).as("Query calls the scratch server answered").isEqualTo(30 + 15);
        // the stored prefixes' saves (5) and the rounds' (2), loads copied (8 begun, 4 asked for) end
        assertThat(r.endCopies()).as("EndCopy calls the scratch server answered").isGreaterThanOrEqualTo(5 + 2 + 8 + 4);
        assertThat(warmUpDirs()).as("its pool file, token and socket removed").isEqualTo(before);
    }

    @Test
    void theWarmUpStopsAtItsBudget() {
        Warmup.Result r = Warmup.run(1_000_000, 300_000_000L);

        assertThat(r.rounds()).isPositive().isLessThan(1_000_000);
        assertThat(r.nanos()).isLessThan(5_000_000_000L);
    }
}
