package io.pegaflow.engine;

/**
 * Where a connector brain finds the engine to use now. The store link (embedded engine, or a
 * client of pegaflow-server that reconnects) is the production source; tests hand a brain a
 * lambda over a binding they switch. A brain reads {@link #binding()} at each operation and
 * never holds an engine across calls, so nobody has to push a new engine into it.
 *
 * <p>The generation changes whenever the engine behind the source is replaced (a restarted
 * server, a new client): leases and plan ids from an older generation mean nothing to the
 * current engine. A source that is briefly without an engine (server unreachable) keeps its
 * generation, so what it issued stays valid if the same engine comes back.
 */
@FunctionalInterface
public interface EngineSource {
    /** The engine now ({@code engine} null: none, every lookup misses) and its generation. Any thread. */
    Binding binding();

    /** An engine and the generation it belongs to. */
    record Binding(PegaEngine engine, long generation) {
        public static final Binding NONE = new Binding(null, 0);
    }
}
