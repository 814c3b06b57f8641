package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.client.RemoteStore;
import io.pegaflow.engine.BlockHashes;
import io.pegaflow.engine.InstanceSpec;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.KvLayout;
import io.pegaflow.engine.LayerRegion;
import io.pegaflow.engine.WorkerSpec;
import io.pegaflow.engine.PoolInUseException;
import io.pegaflow.engine.pool.HostPool;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The server's files on disk (pool, {@code <pool>.sock}, {@code <pool>.lock}): modes 0600 or
 * 0660 with a group; a pool path that is a symbolic link refused with its target untouched; a
 * second server on a live pool refused, naming the first, with nothing on disk changed; a
 * stale pool, socket and lock left by a dead owner reclaimed; a clean stop leaves nothing.
 */
class PoolFilesTest {
    private static final long POOL = 4L << 20;

    @TempDir
    Path dir;

    private final List<PegaflowServer> servers = new ArrayList<>();
    private final Arena arena = Arena.ofShared();

    @AfterEach
    void stop() {
        servers.forEach(PegaflowServer::close);
        arena.close();
    }

    /** An instance "inst" with its one worker, so queries answer. */
    private void register(PegaflowServer s) {
        long base = arena.allocate(4096, 4096).address();
        s.store().registerInstance(new InstanceSpec("inst", "ns", 1, 1));
        s.store().registerWorker("inst", new WorkerSpec(0, 0, 0,
                List.of(new LayerRegion("l", KvLayout.MLA, base, 4096, 1, 4096, 4096, 0))));
    }

    private PegaflowServer start(Path pool, String group) throws IOException {
        PegaflowServer s = PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:0", null, POOL, pool,
                Duration.ofSeconds(600), Duration.ofMillis(100), true, group));
        servers.add(s);
        return s;
    }

    private static Path sock(Path pool) {
        return Path.of(pool + ".sock");
    }

    private static Path lock(Path pool) {
        return Path.of(pool + ".lock");
    }

    private static String mode(Path p) throws IOException {
        return PosixFilePermissions.toString(Files.getPosixFilePermissions(p, LinkOption.NOFOLLOW_LINKS));
    }

    @Test
    void poolSocketAndLockAreThisUsersAloneAndACleanStopRemovesThem() throws Exception {
        Path pool = dir.resolve("pool");
        PegaflowServer s = start(pool, null);
        assertThat(mode(pool)).isEqualTo("rw-------");
        assertThat(mode(sock(pool))).isEqualTo("rw-------");
        assertThat(Files.readAttributes(sock(pool), BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS).isOther())
                .as("a socket").isTrue();
        assertThat(mode(lock(pool))).isEqualTo("rw-------");
        assertThat(Files.readString(lock(pool)))
                .isEqualTo("pid=" + ProcessHandle.current().pid() + "\naddr=127.0.0.1:" + s.port() + "\n");
        s.close();
        try (Stream<Path> left = Files.list(dir)) {
            assertThat(left).as("pool, socket, lock and the socket's staging directory are gone").isEmpty();
        }
    }

    @Test
    void aPoolGroupMakesPoolAndSocketGroupReadWriteAndGivesThemToTheGroup() throws Exception {
        // The current user's primary group: a member of it, so this works for any user, root included.
        Path probe = Files.createFile(dir.resolve("probe"));
        String group = Files.readAttributes(probe, PosixFileAttributes.class).group().getName();
        Files.delete(probe);
        Path pool = dir.resolve("pool");
        start(pool, group);
        for (Path p : List.of(pool, sock(pool))) {
            assertThat(mode(p)).as(p.toString()).isEqualTo("rw-rw----");
            assertThat(Files.readAttributes(p, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS).group().getName())
                    .isEqualTo(group);
        }
        assertThat(mode(lock(pool))).as("the lock is the owner's alone").isEqualTo("rw-------");
    }

    @Test
    void anUnknownPoolGroupIsRefusedBeforeAnythingIsCreated() {
        assertThatThrownBy(() -> start(dir.resolve("pool"), "no-such-group-pegaflow"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("'no-such-group-pegaflow' does not exist");
        assertThat(dir.toFile().list()).isEmpty();
    }

    @Test
    void aPoolPathThatIsASymbolicLinkIsRefusedAndItsTargetUntouched() throws Exception {
        Path target = Files.writeString(dir.resolve("precious"), "not a pool");
        Files.setPosixFilePermissions(target, PosixFilePermissions.fromString("rw-r--r--"));
        Path pool = Files.createSymbolicLink(dir.resolve("pool"), target);
        assertThatThrownBy(() -> start(pool, null)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("pool path " + pool + " is a symbolic link (to " + target + ")");
        assertThat(Files.readString(target)).isEqualTo("not a pool");
        assertThat(mode(target)).isEqualTo("rw-r--r--");
        assertThat(Files.readSymbolicLink(pool)).isEqualTo(target);
        assertThat(Files.exists(lock(pool), LinkOption.NOFOLLOW_LINKS)).isFalse();
        assertThat(Files.exists(sock(pool), LinkOption.NOFOLLOW_LINKS)).isFalse();

        // A dangling link (to where an attacker wants a file created) is refused too; nothing is created there.
        Path dangling = Files.createSymbolicLink(dir.resolve("pool2"), dir.resolve("planted"));
        assertThatThrownBy(() -> start(dangling, null)).isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("is a symbolic link");
        assertThat(Files.exists(dir.resolve("planted"), LinkOption.NOFOLLOW_LINKS)).isFalse();
    }

    @Test
    void aSecondServerOnALivePoolIsRefusedNamingTheFirstAndChangesNothing() throws Exception {
        Path pool = dir.resolve("pool");
        PegaflowServer first = start(pool, null);
        register(first);
        Map<String, String> before = snapshot(dir);

        for (int attempt = 0; attempt < 2; attempt++) { // twice: the refusal released nothing of the first's lock
            assertThatThrownBy(() -> start(pool, null)).isInstanceOfSatisfying(PoolInUseException.class, e -> {
                assertThat(e.holderPid()).isEqualTo(Long.toString(ProcessHandle.current().pid()));
                assertThat(e.holderAddr()).isEqualTo("127.0.0.1:" + first.port());
                assertThat(e.getMessage()).contains("pid " + ProcessHandle.current().pid() + " at 127.0.0.1:" + first.port())
                        .contains(lock(pool).toString());
            });
            assertThat(snapshot(dir)).isEqualTo(before);
        }

        // A second server on the first's busy port but its own pool fails to bind, and removes only its own files.
        Path other = dir.resolve("other");
        assertThatThrownBy(() -> PegaflowServer.start(new PegaflowServer.Config("127.0.0.1:" + first.port(), null, POOL,
                other, Duration.ofSeconds(600), Duration.ofMillis(100), true))).isInstanceOf(IOException.class);
        assertThat(snapshot(dir)).isEqualTo(before);

        // The first still serves: its pool maps, and a query answers over its socket.
        try (HostPool mapped = HostPool.shared(pool, POOL, false);
                RemoteStore client = RemoteStore.connect("127.0.0.1:" + first.port(), 2000)) {
            assertThat(mapped.size()).isEqualTo(POOL);
            assertThat(client.query("inst", BlockHashes.of(new byte[][] {new byte[32]})).hitBlocks()).isZero();
            assertThat(client.localCalls()).isEqualTo(1);
        }
    }

    @Test
    void aStalePoolSocketAndLockLeftByADeadOwnerAreReclaimed() throws Exception {
        Path pool = dir.resolve("pool");
        Files.writeString(pool, "stale bytes");
        Files.setPosixFilePermissions(pool, PosixFilePermissions.fromString("rw-r--r--"));
        try (ServerSocketChannel dead = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            dead.bind(UnixDomainSocketAddress.of(sock(pool))); // closing leaves the socket file, as a crash does
        }
        Files.writeString(lock(pool), "pid=999999\naddr=127.0.0.1:1\n"); // nobody holds it
        List<String> logged = new ArrayList<>();
        Logger log = Logger.getLogger("io.pegaflow.engine.pool.PoolFiles");
        Handler capture = new Handler() {
            @Override
            public void publish(LogRecord r) {
                logged.add(r.getMessage());
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        log.addHandler(capture);
        PegaflowServer s;
        try {
            s = start(pool, null);
        } finally {
            log.removeHandler(capture);
        }

        // A new file (its inode number may be the old one's, reused): zeros, not the stale bytes, and 0600.
        assertThat(new String(Files.readAllBytes(pool), 0, 11, StandardCharsets.ISO_8859_1)).isEqualTo("\0".repeat(11));
        assertThat(mode(pool)).isEqualTo("rw-------");
        assertThat(Files.size(pool)).isEqualTo(POOL);
        assertThat(Files.readString(lock(pool))).startsWith("pid=" + ProcessHandle.current().pid() + "\n");
        assertThat(logged).anySatisfy(m -> assertThat(m).contains("reclaimed stale pool " + pool).contains("pid 999999"));
        assertThat(logged).anySatisfy(m -> assertThat(m).contains("reclaimed stale socket " + sock(pool)));
        try (RemoteStore client = RemoteStore.connect("127.0.0.1:" + s.port(), 2000)) {
            register(s);
            client.query("inst", BlockHashes.of(new byte[][] {new byte[32]}));
            assertThat(client.localCalls()).as("the new socket answers").isEqualTo(1);
        }
    }

    /** Every file in {@code dir}: identity, size, time, mode and (small files) content. */
    private static Map<String, String> snapshot(Path dir) throws IOException {
        Map<String, String> out = new TreeMap<>();
        try (Stream<Path> files = Files.list(dir)) {
            for (Path p : files.toList()) {
                PosixFileAttributes a = Files.readAttributes(p, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
                out.put(p.getFileName().toString(), a.fileKey() + " " + a.size() + " " + a.lastModifiedTime() + " "
                        + PosixFilePermissions.toString(a.permissions())
                        + (a.isRegularFile() && a.size() < 1024 ? " " + Files.readString(p) : ""));
            }
        }
        return out;
    }
}
