package io.pegaflow.engine.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Which pages a shared pool file gets, read from the mount that holds it. */
class HostPoolPagesTest {
    private static final List<String> MOUNTS = List.of(
            "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
            "tmpfs /dev/shm tmpfs rw,relatime,size=24683652k 0 0",
            "pegaflow-thp /mnt/pf\\040thp tmpfs rw,relatime,size=67108864k,huge=always 0 0",
            "pegaflow-adv /mnt/adv tmpfs rw,relatime,huge=advise 0 0",
            "none /mnt/huge hugetlbfs rw,relatime,pagesize=2M 0 0",
            "none /mnt/huge/gig hugetlbfs rw,relatime,pagesize=1024M 0 0",
            "/dev/vda1 / ext4 rw,relatime 0 0");

    @Test
    void aPlainTmpfsGivesBasePages() {
        HostPool.Pages p = HostPool.Pages.fromMounts("/dev/shm/pegaflow.pool", MOUNTS);
        assertEquals(new HostPool.Pages("tmpfs", "/dev/shm", 0), p);
        assertEquals(1000, p.round(1000));
        assertEquals("tmpfs at /dev/shm, 4 KiB pages", p.describe());
    }

    @Test
    void hugeMountsGiveTheirPageSizeAndTheLongestMountWins() {
        assertEquals(2L << 20, HostPool.Pages.fromMounts("/mnt/pf thp/pool", MOUNTS).hugeBytes());
        assertEquals(2L << 20, HostPool.Pages.fromMounts("/mnt/adv/pool", MOUNTS).hugeBytes());
        HostPool.Pages h = HostPool.Pages.fromMounts("/mnt/huge/pool", MOUNTS);
        assertEquals(new HostPool.Pages("hugetlbfs", "/mnt/huge", 2L << 20), h);
        assertEquals(4L << 20, h.round((2L << 20) + 512)); // hugetlbfs maps whole huge pages only
        assertEquals(1L << 30, HostPool.Pages.fromMounts("/mnt/huge/gig/pool", MOUNTS).hugeBytes());
        assertEquals("ext4", HostPool.Pages.fromMounts("/mnt/hugely/pool", MOUNTS).fs()); // a name prefix is not a mount
    }

    @Test
    void aSharedPoolIsCreatedAndMappedAtTheSameSize() throws Exception {
        Path dir = Files.isDirectory(Path.of("/dev/shm")) ? Path.of("/dev/shm") : Path.of(System.getProperty("java.io.tmpdir"));
        Path file = dir.resolve("pegaflow-pages-test-" + ProcessHandle.current().pid() + ".pool");
        try (HostPool server = HostPool.createShared(file, (8L << 20) + 100, null);
                HostPool worker = HostPool.shared(file, (8L << 20) + 100, false)) {
            assertEquals(server.size(), worker.size());
            assertEquals(server.size(), Files.size(file)); // sized by the mapping, no write()
            server.segment().set(java.lang.foreign.ValueLayout.JAVA_LONG, server.size() - 8, 42L);
            assertEquals(42L, worker.segment().get(java.lang.foreign.ValueLayout.JAVA_LONG, worker.size() - 8));
        }
    }
}
