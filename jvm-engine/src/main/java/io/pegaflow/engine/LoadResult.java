package io.pegaflow.engine;

/** Outcome of a load: blocks copied into the worker's regions and bytes moved. */
public record LoadResult(int blocks, long bytes) {}
