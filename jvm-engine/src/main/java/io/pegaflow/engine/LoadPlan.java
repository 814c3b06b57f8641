package io.pegaflow.engine;

/**
 * Where a load reads from: for each {@code k}, the slot of region {@code regionIndex[k]} for
 * leased block {@code blockIndex[k]} (an index into the destination block ids) is at pool
 * offset {@code hostOffset[k]}. The blocks stay pinned until the load ends.
 */
public record LoadPlan(long loadId, int blocks, int[] blockIndex, int[] regionIndex, long[] hostOffset) {}
