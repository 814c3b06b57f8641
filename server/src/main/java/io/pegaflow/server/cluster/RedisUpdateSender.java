package io.pegaflow.server.cluster;

import io.lettuce.core.RedisFuture;
import io.lettuce.core.ScriptOutputType;
import io.pegaflow.server.cluster.RedisBlockRegistry.Link;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * {@link AdvertisementQueue.Sender} on Redis: the queue's netted updates pipelined on
 * {@link RegistryMembership}'s flusher connection, as {@code SETBIT} (advertise) and scripts
 * that clear a bit and delete an empty bitmap (withdraw, a claim found wrong, a departed host).
 * Called by the flusher thread only.
 */
final class RedisUpdateSender implements AdvertisementQueue.Sender {
    /** Clears a departed host's bit, unless a host holds its index again (KEYS[2], its node key). */
    private static final String CLEAN = """
            if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
            redis.call('SETBIT', KEYS[1], ARGV[1], 0)
            if redis.call('BITCOUNT', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
            return 1""";
    private static final String WITHDRAW = """
            redis.call('SETBIT', KEYS[1], ARGV[1], 0)
            if redis.call('BITCOUNT', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
            return 1""";

    private final RedisBlockRegistry.Settings settings;
    private final RegistryMembership membership;
    private final AtomicLong advertised = new AtomicLong();
    private final AtomicLong withdrawn = new AtomicLong();

    RedisUpdateSender(RedisBlockRegistry.Settings settings, RegistryMembership membership) {
        this.settings = settings;
        this.membership = membership;
    }

    long advertised() {
        return advertised.get();
    }

    long withdrawn() {
        return withdrawn.get();
    }

    @Override
    public boolean healthy() {
        return membership.index() >= 0 && membership.connected();
    }

    @Override
    public void failed(String what, Exception e) {
        membership.failed(what, e);
    }

    @Override
    public int index() {
        return membership.index();
    }

    @Override
    public boolean send(Map<ByteBuffer, Boolean> batch, Map<ByteBuffer, Integer> forget) throws Exception {
        Link c = membership.pipe();
        int me = membership.index();
        if (c == null || me < 0 || !membership.connected()) {
            return false;
        }
        List<RedisFuture<?>> pending = new ArrayList<>(Math.min(batch.size() + forget.size(), AdvertisementQueue.FLUSH_BATCH));
        long adv = 0;
        long wd = 0;
        byte[] meArg = Integer.toString(me).getBytes(StandardCharsets.US_ASCII);
        for (Map.Entry<ByteBuffer, Boolean> e : batch.entrySet()) {
            byte[] key = e.getKey().array();
            if (e.getValue()) {
                pending.add(c.str().setbit(key, me, 1));
                adv++;
            } else {
                pending.add(c.lua().eval(WITHDRAW, ScriptOutputType.INTEGER, new byte[][] {key}, meArg));
                wd++;
            }
            if (pending.size() >= AdvertisementQueue.FLUSH_BATCH) {
                drain(c, pending);
            }
        }
        for (Map.Entry<ByteBuffer, Integer> e : forget.entrySet()) {
            int owner = e.getValue();
            if (owner >= 0) {
                pending.add(c.lua().eval(WITHDRAW, ScriptOutputType.INTEGER, new byte[][] {e.getKey().array()},
                        Integer.toString(owner).getBytes(StandardCharsets.US_ASCII)));
            } else if (settings.cluster()) {
                // A script may touch one shard only: the block key and the node key live on two.
                // The departed host's absence was seen in the last heartbeat's view instead.
                pending.add(c.lua().eval(WITHDRAW, ScriptOutputType.INTEGER, new byte[][] {e.getKey().array()},
                        Integer.toString(-1 - owner).getBytes(StandardCharsets.US_ASCII)));
            } else {
                pending.add(c.lua().eval(CLEAN, ScriptOutputType.INTEGER,
                        new byte[][] {e.getKey().array(), RegistryKeys.nodeKey(-1 - owner)},
                        Integer.toString(-1 - owner).getBytes(StandardCharsets.US_ASCII)));
            }
            if (pending.size() >= AdvertisementQueue.FLUSH_BATCH) {
                drain(c, pending);
            }
        }
        drain(c, pending);
        advertised.addAndGet(adv);
        withdrawn.addAndGet(wd);
        return true;
    }

    private void drain(Link c, List<RedisFuture<?>> pending) throws Exception {
        if (pending.isEmpty()) {
            return;
        }
        CompletableFuture<?>[] each = pending.stream().map(f -> f.toCompletableFuture()).toArray(CompletableFuture[]::new);
        CompletableFuture<Void> all = CompletableFuture.allOf(each);
        pending.clear();
        long deadline = System.nanoTime() + settings.timeout().toNanos() * 4;
        long slice = TimeUnit.MILLISECONDS.toNanos(5);
        while (true) {
            // Flushed again while waiting: on a Redis Cluster, commands routed to a shard whose
            // connection was still opening when flushCommands ran can stay in that connection's
            // buffer (redis/lettuce#2420); a later flush sends them once it is open.
            c.conn().flushCommands();
            try {
                all.get(Math.min(slice, Math.max(1, deadline - System.nanoTime())), TimeUnit.NANOSECONDS);
                return;
            } catch (java.util.concurrent.ExecutionException e) {
                throw e.getCause() instanceof Exception x ? x : e;
            } catch (java.util.concurrent.TimeoutException e) {
                if (System.nanoTime() - deadline >= 0) {
                    for (CompletableFuture<?> f : each) {
                        f.cancel(true); // an answer arriving later is discarded
                    }
                    throw new java.util.concurrent.TimeoutException(each.length + " registry updates not answered in "
                            + settings.timeout().multipliedBy(4));
                }
                slice = Math.min(slice * 2, TimeUnit.MILLISECONDS.toNanos(200));
            }
        }
    }
}
