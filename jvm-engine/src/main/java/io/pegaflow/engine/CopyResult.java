package io.pegaflow.engine;

/**
 * Outcome of a save or a load: blocks whose slots were copied, blocks a save skipped because
 * they were resident or already being saved (dedup; always 0 for a load), and bytes moved.
 */
public record CopyResult(int blocks, int skippedBlocks, long bytes) {}
