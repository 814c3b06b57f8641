/**
 * The host pool: one large native region ({@link io.pegaflow.engine.pool.HostPool}, the single
 * owner of its arena), sub-allocated by offset ({@link io.pegaflow.engine.pool.OffsetAllocator}).
 * Embedded, it is an anonymous mapping; with pegaflow-server, a shared-memory file that the
 * server creates and every worker maps.
 *
 * <h2>Files of a shared pool ({@link io.pegaflow.engine.pool.PoolFiles})</h2>
 * <pre>
 *  &lt;pool&gt;        the pool (mapped by workers)       0600, or 0660 + group (--pool-group)
 *  &lt;pool&gt;.sock   the server's Unix socket           same mode as the pool
 *  &lt;pool&gt;.lock   flock held for the server's life   0600; "pid=...\naddr=...\n"
 * </pre>
 * <ul>
 *   <li><b>Lock first.</b> The exclusive flock on {@code <pool>.lock} is taken before anything
 *       is created or deleted. A second server finds it held, names the holder's pid and
 *       address from the file, and changes nothing on disk.</li>
 *   <li><b>Stale files are reclaimed.</b> The kernel drops a flock when its holder dies,
 *       however it dies; a pool or socket found while holding the lock was left by a dead
 *       owner, so it is deleted (logged) and created anew. Workers' old mappings stay valid
 *       until they unmap; the store link maps the new pool when the server id changes.</li>
 *   <li><b>Created exclusively, never through a link</b> (O_CREAT|O_EXCL|O_NOFOLLOW for the
 *       pool, an exclusive hard link for the socket): a file or symbolic link planted at the
 *       path in world-writable {@code /dev/shm} is refused, never reused or followed; a pool or
 *       socket path that is a symbolic link is refused by name.</li>
 *   <li><b>Modes.</b> The pool holds every tenant's KV cache: 0600 unless a group is given.
 *       Modes are set after creation (the umask neither widens nor narrows them), the group
 *       before the mode, so a file is never open to the wrong group. The socket is bound in
 *       a fresh 0700 directory and published once its mode is right: bind-then-chmod leaves a
 *       window in which, under a permissive umask, anyone can connect.</li>
 *   <li><b>A process deletes only what it created</b>: the pool ({@link
 *       io.pegaflow.engine.pool.HostPool#close()}), the socket, and last the lock file, while
 *       still holding the lock (a process that then locks the unlinked file notices and starts
 *       over).</li>
 * </ul>
 */
package io.pegaflow.engine.pool;
