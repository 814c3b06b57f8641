package io.pegaflow.engine.pool;

import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.PoolInUseException;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileSystemException;
import java.nio.file.FileSystems;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.nio.file.attribute.UserPrincipalNotFoundException;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;

/**
 * The files of a shared pool, {@code <pool>}, {@code <pool>.sock} and {@code <pool>.lock}:
 * locked before anything is created or deleted, created exclusively with mode 0600 (0660 with
 * a group), stale ones reclaimed, each deleted only by the process that created it. The rules
 * and their reasons are in the package documentation. One owner; {@link #close()} is
 * idempotent and may run on a shutdown hook.
 */
public final class PoolFiles implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(PoolFiles.class.getName());
    static final Set<PosixFilePermission> OWNER_RW = PosixFilePermissions.fromString("rw-------");
    private static final Set<PosixFilePermission> GROUP_RW = PosixFilePermissions.fromString("rw-rw----");
    static final Set<PosixFilePermission> OWNER_RWX = PosixFilePermissions.fromString("rwx------");
    private static final int ATTEMPTS = 100;

    /** Creates a socket bound at {@code path} (a staging path; see {@link #bindSocket}). */
    @FunctionalInterface
    public interface SocketBinder<T extends Closeable> {
        T bind(Path path) throws IOException;
    }

    /** What a lock file says about its holder: {@code pid=...} and {@code addr=...} lines. */
    public record Holder(String pid, String addr) {
        static Holder parse(String text) {
            String pid = "?";
            String addr = "?";
            for (String line : text.split("\n")) {
                if (line.startsWith("pid=")) {
                    pid = line.substring(4).strip();
                } else if (line.startsWith("addr=")) {
                    addr = line.substring(5).strip();
                }
            }
            return new Holder(pid, addr);
        }

        String text() {
            return "pid=" + pid + "\naddr=" + addr + "\n";
        }

        @Override
        public String toString() {
            return "pid " + pid + " at " + addr;
        }
    }

    private final Path pool;
    private final Path socket;
    private final Path lock;
    private final GroupPrincipal group;
    private Holder previous;
    private int fd;

    private PoolFiles(Path pool, GroupPrincipal group, int fd) {
        this.pool = pool;
        this.socket = Path.of(pool + ".sock");
        this.lock = lockFile(pool);
        this.group = group;
        this.fd = fd;
    }

    /** {@code <pool>.lock}. */
    public static Path lockFile(Path pool) {
        return Path.of(pool + ".lock");
    }

    /**
     * Takes {@code pool}'s lock, recording this process's pid and {@code addr}, then deletes a
     * stale pool and socket left by a dead owner. Refuses, changing nothing: a pool held by a
     * live process ({@link PoolInUseException} naming its pid and address), a pool or socket path
     * that is a symbolic link or a directory. {@code group} null: the files are 0600, else 0660
     * and owned by that group.
     */
    public static PoolFiles claim(Path pool, String group, String addr) throws IOException {
        GroupPrincipal principal = group(group);
        Path lock = lockFile(pool);
        // flock, not FileChannel.tryLock: fcntl locks belong to the process, and closing any
        // descriptor of the file in this JVM drops them (reading the lock file for a refusal
        // message, or a second server in the same JVM as in tests, would release the owner's
        // lock); a flock belongs to its open file description.
        int fd = -1;
        boolean created = false;
        for (int attempt = 0; fd < 0; attempt++) {
            if (attempt == ATTEMPTS) {
                throw new IOException("lock file " + lock + " was replaced " + ATTEMPTS + " times while taking it");
            }
            int candidate;
            try {
                candidate = LibC.open(lock.toString(),
                        LibC.O_RDWR | LibC.O_CREAT | LibC.O_EXCL | LibC.O_NOFOLLOW | LibC.O_CLOEXEC, 0600);
                created = true;
            } catch (LibC.ErrnoException e) {
                if (e.errno != LibC.EEXIST) {
                    throw openFailure(lock, pool, e);
                }
                try {
                    candidate = LibC.open(lock.toString(), LibC.O_RDWR | LibC.O_NOFOLLOW | LibC.O_CLOEXEC, 0);
                    created = false;
                } catch (LibC.ErrnoException again) {
                    if (again.errno == LibC.ENOENT) {
                        continue; // its owner deleted it on the way out: create it
                    }
                    throw openFailure(lock, pool, again);
                }
            }
            try {
                LibC.flock(candidate, LibC.LOCK_EX | LibC.LOCK_NB);
            } catch (LibC.ErrnoException e) {
                LibC.close(candidate);
                if (e.errno == LibC.EWOULDBLOCK) {
                    throw inUse(pool, lock);
                }
                throw new IOException("cannot lock " + lock + ": " + e.getMessage());
            }
            // An owner deletes the lock file before it unlocks; if ours was deleted (or replaced)
            // between open and flock, we hold a lock nobody else can find: start over.
            boolean current;
            try {
                current = isLockFile(candidate, lock);
            } catch (IOException | RuntimeException e) {
                LibC.close(candidate);
                throw e;
            }
            if (current) {
                fd = candidate;
            } else {
                LibC.close(candidate);
            }
        }
        PoolFiles files = new PoolFiles(pool, principal, fd);
        try {
            if (!created) {
                files.previous = Holder.parse(new String(Files.readAllBytes(descriptor(fd)), StandardCharsets.UTF_8));
            }
            setMode(lock, null, LinkOption.NOFOLLOW_LINKS); // 0600 whatever the umask or a stale file's mode
            files.update(addr);
            files.reclaim();
            return files;
        } catch (IOException | RuntimeException e) {
            files.close();
            throw e;
        }
    }

    /** The group called {@code name} (null for null); unknown names are refused. */
    public static GroupPrincipal group(String name) {
        if (name == null) {
            return null;
        }
        try {
            return FileSystems.getDefault().getUserPrincipalLookupService().lookupPrincipalByGroupName(name);
        } catch (UserPrincipalNotFoundException e) {
            throw new InvalidArgumentException("pool group '" + name + "' does not exist on this host (--pool-group)");
        } catch (IOException e) {
            throw new InvalidArgumentException("cannot look up pool group '" + name + "': " + e);
        }
    }

    public Path pool() {
        return pool;
    }

    public Path socket() {
        return socket;
    }

    public Path lock() {
        return lock;
    }

    /** The holder a stale lock file named when this process took it over (null if it created the file). */
    public Holder previous() {
        return previous;
    }

    /** Creates the pool file exclusively with this claim's mode and maps it ({@link HostPool#createShared}). */
    public HostPool createPool(long bytes) {
        return HostPool.createShared(pool, bytes, group);
    }

    /**
     * Binds a Unix socket with {@code binder} and publishes it at {@link #socket()} with this
     * claim's mode. Not bind-then-chmod: bind(2) creates the socket file as 0777 less the umask
     * and Java listens at once, so with a permissive umask another user could connect before the
     * chmod. Bound inside a fresh directory only this user can enter (0700), the socket is
     * unreachable until its mode and group are right; a hard link then publishes it, failing
     * (not replacing) if anything appeared at the path. The staging directory is removed.
     */
    public <T extends Closeable> T bindSocket(SocketBinder<T> binder) throws IOException {
        Path dir = privateDirectory(socket.toAbsolutePath().getParent());
        Path staged = dir.resolve("s");
        T bound = null;
        try {
            bound = binder.bind(staged);
            // Following links is safe here (nothing else can enter the directory), and needed:
            // the no-follow form opens the file for fchmod, and a socket cannot be opened.
            setMode(staged, group);
            try {
                Files.createLink(socket, staged);
            } catch (FileAlreadyExistsException e) {
                throw new InvalidArgumentException("socket path " + socket + " appeared while this server started; "
                        + "refusing to replace it");
            }
            return bound;
        } catch (IOException | RuntimeException e) {
            if (bound != null) {
                try {
                    bound.close();
                } catch (IOException suppressed) {
                    e.addSuppressed(suppressed);
                }
            }
            throw e;
        } finally {
            try {
                Files.deleteIfExists(staged);
                Files.deleteIfExists(dir);
            } catch (IOException e) {
                LOG.log(System.Logger.Level.WARNING, "cannot remove staging directory " + dir + ": " + e);
            }
        }
    }

    /** Rewrites the lock file's address (once the server knows its port). */
    public synchronized void update(String addr) throws IOException {
        if (fd < 0) {
            throw new IllegalStateException("lock " + lock + " was released");
        }
        Files.writeString(descriptor(fd), new Holder(Long.toString(ProcessHandle.current().pid()), addr).text(),
                StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING);
    }

    /**
     * Deletes the lock file, then releases the lock: a process that opened the file before the
     * delete and locks it after finds it unlinked and starts over. Call after the pool and the
     * socket are closed (they are deleted by their owners under this lock).
     */
    @Override
    public synchronized void close() {
        if (fd < 0) {
            return;
        }
        try {
            if (isLockFile(fd, lock)) {
                Files.delete(lock);
            }
        } catch (IOException e) {
            LOG.log(System.Logger.Level.WARNING, "cannot remove lock file " + lock + ": " + e);
        } finally {
            LibC.close(fd);
            fd = -1;
        }
    }

    /** Mode 0600 (no group) or 0660 with {@code group}; the group is set first, while still 0600. */
    static void setMode(Path file, GroupPrincipal group, LinkOption... options) throws IOException {
        PosixFileAttributeView view = Files.getFileAttributeView(file, PosixFileAttributeView.class, options);
        if (group == null) {
            view.setPermissions(OWNER_RW);
            return;
        }
        try {
            view.setGroup(group);
        } catch (FileSystemException e) {
            throw new InvalidArgumentException("cannot give " + file + " to group '" + group.getName() + "' ("
                    + e.getReason() + "): this user must be a member of it (--pool-group)");
        }
        view.setPermissions(GROUP_RW);
    }

    private void reclaim() throws IOException {
        BasicFileAttributes poolAttrs = existing(pool, "pool");
        BasicFileAttributes socketAttrs = existing(socket, "socket");
        String owner = previous == null ? "an owner that left no lock file" : previous.toString();
        if (poolAttrs != null) {
            Files.delete(pool);
            LOG.log(System.Logger.Level.WARNING, "reclaimed stale pool " + pool + " (" + poolAttrs.size()
                    + " bytes) left by " + owner + ", which no longer holds " + lock);
        }
        if (socketAttrs != null) {
            Files.delete(socket);
            LOG.log(System.Logger.Level.WARNING, "reclaimed stale socket " + socket + " left by " + owner);
        }
    }

    /** The attributes of a stale file at {@code path}, null if there is none; refuses links and directories. */
    private static BasicFileAttributes existing(Path path, String what) throws IOException {
        BasicFileAttributes a;
        try {
            a = Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
        } catch (NoSuchFileException e) {
            return null;
        }
        if (a.isSymbolicLink()) {
            throw new InvalidArgumentException(what + " path " + path + " is a symbolic link (to "
                    + Files.readSymbolicLink(path) + "); refusing to follow or replace it: give the real path (--pool-path)");
        }
        if (a.isDirectory()) {
            throw new InvalidArgumentException(what + " path " + path + " is a directory; expected no file there, "
                    + "or a stale " + what + " (--pool-path)");
        }
        return a;
    }

    private static boolean isLockFile(int fd, Path lock) throws IOException {
        Object held = Files.readAttributes(descriptor(fd), BasicFileAttributes.class).fileKey();
        try {
            return held.equals(Files.readAttributes(lock, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS).fileKey());
        } catch (NoSuchFileException e) {
            return false;
        }
    }

    /** The file behind our descriptor, whatever its path now names. */
    private static Path descriptor(int fd) {
        return Path.of("/proc/self/fd/" + fd);
    }

    private static PoolInUseException inUse(Path pool, Path lock) {
        Holder holder;
        String unread = "";
        try (InputStream in = Files.newInputStream(lock, LinkOption.NOFOLLOW_LINKS)) {
            holder = Holder.parse(new String(in.readAllBytes(), StandardCharsets.UTF_8));
        } catch (IOException e) {
            holder = new Holder("?", "?");
            unread = " (its lock file could not be read: " + e + ")";
        }
        return new PoolInUseException("pool " + pool + " is in use by the server with " + holder + unread
                + ", which holds " + lock + "; nothing was changed: stop that server, or give this one another "
                + "--addr or --pool-path", holder.pid(), holder.addr());
    }

    private static RuntimeException openFailure(Path lock, Path pool, LibC.ErrnoException e) {
        if (e.errno == LibC.ELOOP) {
            return new InvalidArgumentException("lock file " + lock + " is a symbolic link; refusing to follow it "
                    + "(remove it, or give another --pool-path)");
        }
        if (e.errno == LibC.EACCES) {
            return new InvalidArgumentException("cannot open lock file " + lock + " (permission denied): it belongs to "
                    + "another user, whose server may be using pool " + pool + "; give another --pool-path");
        }
        return new InvalidArgumentException("cannot open lock file " + lock + " for pool " + pool + ": " + e.getMessage());
    }

    private static Path privateDirectory(Path parent) throws IOException {
        for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
            // Short on purpose: a Unix socket path has at most 107 bytes.
            Path dir = parent.resolve(".pf" + Integer.toHexString(ThreadLocalRandom.current().nextInt()));
            try {
                return Files.createDirectory(dir, PosixFilePermissions.asFileAttribute(OWNER_RWX));
            } catch (FileAlreadyExistsException e) {
                // another name
            }
        }
        throw new IOException("cannot create a staging directory in " + parent);
    }
}
