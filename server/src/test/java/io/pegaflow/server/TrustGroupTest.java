package io.pegaflow.server;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pegaflow.engine.InvalidArgumentException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code --trust-group}: specs parsed and refused with the field and the format named; a set
 * of groups that would share a Unix group (so its members could map two pools) refused; a
 * group's server has a pool, token, socket and lock of its own, all its Unix group's, its
 * own store (a block the server holds is not the group's), and the server's operator token.
 * That another user cannot open them is the security tier's (it needs a second uid).
 */
class TrustGroupTest {
    @TempDir
    Path dir;

    /** A Unix group every Debian-like host has, other than the running user's own. */
    private static final String UNIX_A = "daemon";
    private static final String UNIX_B = "bin";

    @Test
    void aSpecParsesIntoItsFields() {
        TrustGroup g = TrustGroup.parse("name=team-a,size=64mb,unix-group=" + UNIX_A + ",addr=127.0.0.1:0,http=127.0.0.1:0");
        assertThat(g).isEqualTo(new TrustGroup("team-a", 64L << 20, UNIX_A, "127.0.0.1:0", "127.0.0.1:0"));
        assertThat(g.poolPath(Path.of("/dev/shm/p.pool"))).isEqualTo(Path.of("/dev/shm/p.pool.group-team-a"));
        assertThat(TrustGroup.parse(" name=b , size=1gb, unix-group=" + UNIX_B + ", addr=127.0.0.1:7").httpAddr()).isNull();
    }

    @Test
    void badSpecsAreRefusedNamingWhatIsWrong() {
        String ok = ",size=64mb,unix-group=" + UNIX_A + ",addr=127.0.0.1:0";
        assertThatThrownBy(() -> TrustGroup.parse("size=64mb,unix-group=" + UNIX_A + ",addr=127.0.0.1:0"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("lacks name=")
                .hasMessageContaining("name=NAME,size=SIZE,unix-group=GROUP,addr=HOST:PORT");
        assertThatThrownBy(() -> TrustGroup.parse("name=a,size=64mb,addr=127.0.0.1:0"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("lacks unix-group=");
        assertThatThrownBy(() -> TrustGroup.parse("name=a" + ok + ",colour=red"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("'colour' unknown");
        assertThatThrownBy(() -> TrustGroup.parse("name=a,name=b" + ok))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("'name' unknown, repeated");
        assertThatThrownBy(() -> TrustGroup.parse("name=A" + ok))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("name 'A'").hasMessageContaining("a-z 0-9");
        assertThatThrownBy(() -> TrustGroup.parse("name=../x" + ok))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("name '../x'");
        assertThatThrownBy(() -> TrustGroup.parse("name=a,size=0,unix-group=" + UNIX_A + ",addr=127.0.0.1:0"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("size");
        assertThatThrownBy(() -> TrustGroup.parse("name=a,size=64mb,unix-group=no-such-group-here,addr=127.0.0.1:0"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("no-such-group-here");
        assertThatThrownBy(() -> TrustGroup.parse("name=a,size=64mb,unix-group=" + UNIX_A + ",addr=nowhere"))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("addr");
        assertThatThrownBy(() -> TrustGroup.parse("x".repeat(2000)))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("2000 characters");
    }

    @Test
    void groupsThatWouldShareAUnixGroupAreRefused() throws Exception {
        TrustGroup a = new TrustGroup("a", 1 << 20, UNIX_A, "127.0.0.1:0", null);
        TrustGroup b = new TrustGroup("b", 1 << 20, UNIX_B, "127.0.0.1:0", null);
        TrustGroup.checkApart(List.of(a, b), null);
        assertThatThrownBy(() -> TrustGroup.checkApart(List.of(a, new TrustGroup("c", 1 << 20, UNIX_A, "127.0.0.1:0", null)), null))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("shares Unix group " + UNIX_A)
                .hasMessageContaining("--trust-group a");
        assertThatThrownBy(() -> TrustGroup.checkApart(List.of(a, b), UNIX_B))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("with --pool-group");
        int binGid = gidOf(UNIX_B);
        assertThatThrownBy(() -> new TrustGroup("d", 1 << 20, String.valueOf(binGid), "127.0.0.1:0", null))
                .as("a gid can name another group's group: names only").isInstanceOf(InvalidArgumentException.class)
                .hasMessageContaining("unix-group " + binGid + " is a number");
        assertThatThrownBy(() -> TrustGroup.checkApart(List.of(a), String.valueOf(binGid)))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("--pool-group " + binGid + " is a number");
        assertThatThrownBy(() -> TrustGroup.checkApart(List.of(a, a), null))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("name a given twice");
        List<TrustGroup> many = new ArrayList<>(Collections.nCopies(17, a));
        assertThatThrownBy(() -> TrustGroup.checkApart(many, null))
                .isInstanceOf(InvalidArgumentException.class).hasMessageContaining("at most 16");
    }

    private static int gidOf(String group) throws java.io.IOException {
        for (String line : Files.readAllLines(Path.of("/etc/group"))) {
            String[] f = line.split(":");
            if (f.length > 2 && f[0].equals(group)) {
                return Integer.parseInt(f[2]);
            }
        }
        throw new AssertionError("no group " + group + " in /etc/group");
    }

    @Test
    void aGroupsServerHasFilesAndAStoreOfItsOwnAndTheOperatorsToken() throws Exception {
        Path pool = dir.resolve("pool");
        PegaflowServer.Config config = new PegaflowServer.Config("127.0.0.1:0", null, 4L << 20, pool, Duration.ofSeconds(60),
                Duration.ofMillis(100), false);
        TrustGroup g = new TrustGroup("a", 4L << 20, UNIX_A, "127.0.0.1:0", null);
        try (PegaflowServer server = PegaflowServer.start(config, false);
                PegaflowServer group = PegaflowServer.start(ServerMain.groupConfig(config, g, server.operatorTokenFile()), true)) {
            assertThat(group.poolPath()).isEqualTo(dir.resolve("pool.group-a"));
            assertThat(group.operatorTokenFile()).isEqualTo(server.operatorTokenFile());
            assertThat(group.tokenFile()).isEqualTo(dir.resolve("pool.group-a.token"));
            assertThat(Files.readString(group.tokenFile())).isNotEqualTo(Files.readString(server.tokenFile()));
            assertThat(Path.of(group.poolPath() + ".lock")).exists(); // the server's own (0600)
            for (Path f : List.of(group.poolPath(), Path.of(group.poolPath() + ".sock"))) {
                PosixFileAttributes a = Files.readAttributes(f, PosixFileAttributes.class);
                assertThat(a.group().getName()).as("%s", f).isEqualTo(UNIX_A);
                assertThat(PosixFilePermissions.toString(a.permissions())).as("%s", f).isIn("rw-rw----", "rwxrwx---");
            }
            PosixFileAttributes t = Files.readAttributes(group.tokenFile(), PosixFileAttributes.class);
            assertThat(t.group().getName()).isEqualTo(UNIX_A);
            assertThat(PosixFilePermissions.toString(t.permissions())).isEqualTo("rw-r-----");
            assertThat(group.store()).isNotSameAs(server.store());
            assertThat(group.cluster()).isNull();
            assertThat(group.store().ssd()).isNull();
        }
        assertThat(dir.resolve("pool.group-a")).doesNotExist();
    }
}
