package io.pegaflow.server;

import io.pegaflow.client.Wire;
import io.pegaflow.engine.InvalidArgumentException;
import io.pegaflow.engine.Limits;
import io.pegaflow.engine.Sizes;
import io.pegaflow.engine.pool.PoolFiles;
import java.nio.file.Path;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * A trust group ({@code --trust-group}): tenants whose bytes are kept apart from every other
 * group's by the host itself. The group has a pool file of its own ({@code <pool>.group-NAME}),
 * its socket and token files beside it, shared with one Unix group of its own (mode 0660, the
 * token 0640) and with nobody else, its lock file (0600, the server's own), its own store and its
 * own gRPC address; the server's operator token serves every group (Shutdown at a group's
 * address stops that group, at the server's address the server and every group). A tenant process outside that Unix group can
 * neither map the pool nor read the token, so no call or memory access of it reaches the
 * group's blocks (docs/security.md, "Trust groups").
 *
 * <p>Why a pool per group rather than per-group arenas of one file: the kernel's file modes are
 * then the isolation, checked on every open and mapping, with nothing of the server's own to get
 * wrong; and a group's tenants map only their group's pool, so no tenant process ever holds a
 * mapping of another group's bytes.
 *
 * @param name      1..32 of {@code a-z 0-9 _ -}, starting with a letter or digit
 * @param poolBytes the group's pool
 * @param unixGroup the Unix group its files are shared with (required, one per trust group)
 * @param addr      its gRPC {@code HOST:PORT} (port 0: any free one)
 * @param httpAddr  its {@code /health /metrics /instances /admin} address, or null for none
 */
public record TrustGroup(String name, long poolBytes, String unixGroup, String addr, String httpAddr) {
    private static final Pattern NAME = Pattern.compile("[a-z0-9][a-z0-9_-]{0,31}");
    /** Groups one server holds at most (each has its own pool, store and ports). */
    public static final int MAX_GROUPS = 16;
    private static final String FORMAT = "name=NAME,size=SIZE,unix-group=GROUP,addr=HOST:PORT[,http=HOST:PORT]";

    public TrustGroup {
        if (name == null || !NAME.matcher(name).matches()) {
            throw new InvalidArgumentException("--trust-group name '" + Limits.quote(name) + "'"
                    + "; expected 1..32 of a-z 0-9 _ -, starting with a letter or digit");
        }
        if (poolBytes <= 0) {
            throw new InvalidArgumentException("--trust-group " + name + " size " + poolBytes + "; expected a positive size");
        }
        if (unixGroup == null || unixGroup.isBlank()) {
            throw new InvalidArgumentException("--trust-group " + name + " has no unix-group; expected the Unix group its "
                    + "tenants' users belong to (without one its files would be the server user's alone, and that user "
                    + "can read every pool already)");
        }
        numeric(unixGroup, "--trust-group " + name + " unix-group");
        PoolFiles.group(unixGroup); // an unknown group is refused here, naming it
        Wire.hostPort(addr, "--trust-group " + name + " addr");
        if (httpAddr != null) {
            Wire.hostPort(httpAddr, "--trust-group " + name + " http");
        }
    }

    /** From {@code name=NAME,size=SIZE,unix-group=GROUP,addr=HOST:PORT[,http=HOST:PORT]}. */
    public static TrustGroup parse(String spec) {
        if (spec == null || spec.length() > 1024) {
            throw new InvalidArgumentException("--trust-group of " + (spec == null ? "null" : spec.length() + " characters")
                    + "; expected " + FORMAT);
        }
        Map<String, String> fields = new LinkedHashMap<>();
        for (String part : spec.split(",", -1)) {
            int eq = part.indexOf('=');
            String key = eq < 0 ? part.strip() : part.substring(0, eq).strip();
            if (eq < 0 || !List.of("name", "size", "unix-group", "addr", "http").contains(key)
                    || fields.put(key, part.substring(eq + 1).strip()) != null) {
                throw new InvalidArgumentException("--trust-group '" + Limits.quote(spec) + "': field '" + Limits.quote(key) + "'"
                        + " unknown, repeated or without a value; expected " + FORMAT);
            }
        }
        for (String required : List.of("name", "size", "unix-group", "addr")) {
            if (!fields.containsKey(required)) {
                throw new InvalidArgumentException("--trust-group '" + Limits.quote(spec) + "' lacks " + required + "=; expected " + FORMAT);
            }
        }
        return new TrustGroup(fields.get("name"), Sizes.parse(fields.get("size")), fields.get("unix-group"),
                fields.get("addr"), fields.get("http"));
    }

    private static void numeric(String group, String what) {
        if (group.chars().allMatch(Character::isDigit)) {
            throw new InvalidArgumentException(what + " " + group + " is a number; expected the Unix group's name (a gid "
                    + "and a name can be one group, which the check that groups are apart compares by name)");
        }
    }

    /** The group's pool file: beside the server's, {@code <pool>.group-NAME}. */
    public Path poolPath(Path serverPool) {
        return Path.of(serverPool + ".group-" + name);
    }

    /**
     * Refuses a set of groups that would not keep their bytes apart: more than {@link
     * #MAX_GROUPS}, a name twice, or a Unix group named twice or equal to the server pool's own
     * ({@code --pool-group}, whose members map the server's pool).
     */
    public static void checkApart(List<TrustGroup> groups, String serverPoolGroup) {
        if (groups.size() > MAX_GROUPS) {
            throw new InvalidArgumentException(groups.size() + " --trust-group flags; expected at most " + MAX_GROUPS);
        }
        Set<String> names = new HashSet<>();
        // Groups are compared by name; a number is also looked up as a gid, and "2" and "bin" can
        // be one group, so numbers are refused where trust groups must be told apart.
        Map<String, String> unix = new LinkedHashMap<>();
        if (serverPoolGroup != null && !groups.isEmpty()) {
            numeric(serverPoolGroup, "--pool-group");
            unix.put(serverPoolGroup, "--pool-group");
        }
        for (TrustGroup g : groups) {
            if (!names.add(g.name())) {
                throw new InvalidArgumentException("--trust-group name " + g.name() + " given twice; expected one flag per group");
            }
            String before = unix.putIfAbsent(g.unixGroup(), "--trust-group " + g.name());
            if (before != null) {
                throw new InvalidArgumentException("--trust-group " + g.name() + " shares Unix group " + g.unixGroup()
                        + " with " + before + "; expected a Unix group of its own (its members could map both pools)");
            }
        }
    }
}
