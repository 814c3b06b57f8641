package io.pegaflow.engine;

/**
 * Outcome of a save: blocks whose slots this call wrote, blocks skipped because they were
 * resident or already being saved (dedup), and bytes copied.
 */
public record SaveResult(int savedBlocks, int skippedBlocks, long bytes) {}
