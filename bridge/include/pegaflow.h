/*
 * pegaflow.h - the C ABI of the PegaFlow-JVM engine (ABI version 5).
 *
 * The engine is Java. A host process (CPython through ctypes, or C, C++, Rust) creates one
 * JVM with JNI_CreateJavaVM, with the engine jar on -Djava.class.path and the options
 *   -Xrs  -Xmx<heap>  --enable-native-access=ALL-UNNAMED  -XX:ErrorFile=<path>
 * then calls the static method io.pegaflow.bridge.Bridge.bootstrap()J once through JNI;
 * it returns the address of a pegaflow_api table. From then on the engine is plain C calls
 * through that table (Panama upcall stubs); no JNI is needed. bridge/c/roundtrip.c is a
 * complete example.
 *
 * Conventions
 *  - Every function returns 0 (PF_OK) or a pf_error code; outputs go through pointers.
 *    After a failure, last_error() gives this thread's message, naming the bad value and
 *    what was expected. A failed call changed nothing (no engine state, no outputs).
 *  - Strings are NUL-terminated UTF-8. Hashes are passed packed: n hashes of hash_len bytes
 *    each (vLLM block hashes, opaque, 1..64 bytes). Leases are 16 bytes.
 *  - Engines and completions are int64 handles. A completion must be freed with
 *    completion_free after it is done (wait or poll said so).
 *
 * Threads
 *  - Any thread may call any function, concurrently: a thread unknown to the JVM is
 *    attached on its first call. Calls do not hold a process-wide lock; the engine takes
 *    its own short locks. wait() blocks only the calling thread.
 *  - Never call into the table from a process forked after the JVM started (the JVM's
 *    threads do not survive fork); a child must start its own JVM (e.g. spawn).
 *  - Do not install handlers for SIGSEGV/SIGBUS that swallow the JVM's own (the JVM uses
 *    them internally); -Xrs leaves SIGINT/SIGTERM to the host.
 */
#ifndef PEGAFLOW_H
#define PEGAFLOW_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PEGAFLOW_ABI_VERSION 9
#define PEGAFLOW_BOOTSTRAP_CLASS "io/pegaflow/bridge/Bridge"
#define PEGAFLOW_BOOTSTRAP_METHOD "bootstrap"
#define PEGAFLOW_BOOTSTRAP_SIGNATURE "()J"
#define PEGAFLOW_LEASE_BYTES 16
#define PEGAFLOW_LAYER_PARAMS 7

/* Error codes (io.pegaflow.engine.ErrorCode). */
enum pf_error {
    PF_OK = 0,
    PF_INVALID_ARGUMENT = 1,
    PF_UNKNOWN_INSTANCE = 2,
    PF_UNKNOWN_LEASE = 3,
    PF_REGISTRATION_INCOMPLETE = 4,
    PF_TOPOLOGY_MISMATCH = 5,
    PF_POOL_EXHAUSTED = 6,
    PF_TRANSFER_FAILED = 7,
    PF_CLOSED = 8,
    PF_INTERNAL = 9,
    PF_CUDA = 10,
    PF_TIMEOUT = 11,
    PF_UNAVAILABLE = 12,
    PF_PERMISSION_DENIED = 13
};

#define PF_FLAG_PREFAULT 1

/* query_request flags and states (since ABI 5). */
#define PF_QUERY_ALL_OR_NOTHING 1
enum pf_query_state { PF_QUERY_READY = 0, PF_QUERY_LOADING = 1 };

/* register_rank: int64 fields per arena (since ABI 5). */
#define PEGAFLOW_ARENA_PARAMS 6

/* completion_on_done's callback: status is the operation's pf_error (0: done). */
typedef void (*pf_completion_cb)(int64_t completion, int32_t status, void *user);

/* layer_params layouts. */
enum pf_layout { PF_SPLIT_KV = 0, PF_COMBINED = 1, PF_MLA = 2 };

typedef struct pegaflow_api {
    uint32_t abi_version;    /* PEGAFLOW_ABI_VERSION; refuse any other */
    uint32_t function_count; /* entries below; later versions only append */

    /* This thread's last error message into buf (truncated to cap-1, NUL-terminated);
       returns the message's full length in bytes. */
    int32_t (*last_error)(char *buf, int32_t cap);

    /* Does nothing; measures the cost of a call. */
    int32_t (*noop)(void);

    /* Creates an engine with its own host pool. pool_size: "30gb", "64mb", ...;
       lease_ttl_ms <= 0: default 600 s; transfer 0 = host copies, 1 = CUDA on device;
       flags: PF_FLAG_PREFAULT commits every pool page now instead of on first write;
       ssd: settings lines "key=value": an SSD tier below the pool, as link_open's (since ABI 3;
       "" for none), and since ABI 8 the pool's policies, "admission=all|seen:N" and
       "eviction=lru|lfu" (docs/engine.md, "Policies"). */
    int32_t (*engine_create)(const char *pool_size, int32_t copy_threads, int64_t lease_ttl_ms,
                             int32_t transfer, int32_t device, int32_t flags, const char *ssd,
                             int64_t *out_engine);

    /* Waits for copies in flight, frees the pool. The handle is invalid afterwards. */
    int32_t (*engine_close)(int64_t engine);

    int32_t (*register_instance)(int64_t engine, const char *instance_id, const char *ns,
                                 int32_t tp_size, int32_t world_size);

    /* layer_names: num_layers names separated by '\n'. layer_params: num_layers x 7 int64:
       layout (pf_layout), base address, region bytes, blocks, block stride, segment bytes,
       segment offset (segment s of block b is at base + b*stride + s*offset). The topology
       seals when the last of world_size workers registers.
       CHECKED: with CUDA copies each region must lie in CUDA device memory (cuMemGetAddressRange);
       one ending past its allocation, or at no allocation, is PF_INVALID_ARGUMENT with the
       numbers and nothing is registered. With host copies each region must lie in memory the
       process may read and write (/proc/self/maps, checked at registration); one that does not
       is PF_INVALID_ARGUMENT naming the first address not covered. The caller still guarantees
       that the memory stays mapped until the instance is unregistered. */
    int32_t (*register_worker)(int64_t engine, const char *instance_id, int32_t worker_rank,
                               int32_t tp_rank, int32_t device_id, int32_t num_layers,
                               const char *layer_names, const int64_t *layer_params);

    /* Releases the instance's leases, waits for its copies; cached blocks stay. */
    int32_t (*unregister_instance)(int64_t engine, const char *instance_id);

    /* Saves the worker's slots of block_ids[i] under hash i (layer_names NULL: all of the
       worker's layers, else '\n'-separated names). wait_stream: a CUstream the copy is
       ordered after (0: none; the legacy default stream is CU_STREAM_LEGACY, 1, as the driver
       names it: PyTorch reports that stream as 0). Returns at once with a completion. CHECKED: n (0..262144,
       Limits.MAX_HASHES_PER_CALL) and hash_len are checked before block_ids or hashes is read
       (PF_INVALID_ARGUMENT naming the cap); the arrays must hold n entries. */
    int32_t (*save)(int64_t engine, const char *instance_id, int32_t worker_rank, int32_t n,
                    const int64_t *block_ids, const uint8_t *hashes, int32_t hash_len,
                    const char *layer_names, int64_t wait_stream, int64_t *out_completion);

    /* Longest resident prefix of the n hashes: out_hit[0] = its length, and a lease pinning
       those blocks when the length is > 0 (else 16 zero bytes: nothing to load or release).
       out_hit[1] > 0 means "not yet": that many blocks after the prefix are being read back
       from the SSD tier, no lease was issued, ask again (since ABI 3). */
    int32_t (*query)(int64_t engine, const char *instance_id, int32_t n, const uint8_t *hashes,
                     int32_t hash_len, int32_t out_hit[2], uint8_t *out_lease);

    /* Consumes this worker's share of the lease and copies the leased blocks into
       dst_block_ids (n = the lease's block count). Returns at once with a completion.
       CHECKED: n is checked against 0..262144 before dst_block_ids is read. */
    int32_t (*load)(int64_t engine, const char *instance_id, int32_t worker_rank,
                    const uint8_t *lease, int32_t n, const int64_t *dst_block_ids,
                    int64_t *out_completion);

    /* Drops a lease of instance_id and its remaining shares (PF_PERMISSION_DENIED for a lease
       issued to another instance: nothing changes). */
    int32_t (*release)(int64_t engine, const char *instance_id, const uint8_t *lease);

    /* Waits up to timeout_ms (< 0: forever). On success out_values (may be NULL) gets
       {blocks saved or loaded, blocks skipped as already resident, bytes copied}. Returns
       the operation's error (PF_TRANSFER_FAILED: see failed_blocks) or PF_TIMEOUT. */
    int32_t (*wait)(int64_t completion, int64_t timeout_ms, int64_t *out_values);

    /* *out_done = 1 when the completion finished (successfully or not). */
    int32_t (*poll)(int64_t completion, int32_t *out_done);

    int32_t (*completion_free)(int64_t completion);

    /* Block ids whose bytes a failed copy did not move (up to cap) and their count. */
    int32_t (*failed_blocks)(int64_t completion, int64_t *out, int32_t cap, int32_t *out_count);

    /* Gauges and counters as a JSON object; *out_len = its length (the buffer needs one more;
       PF_INVALID_ARGUMENT when it is smaller). */
    int32_t (*stats)(int64_t engine, char *buf, int32_t cap, int32_t *out_len);

    /* Closes every engine and frees every completion (call before process exit). */
    int32_t (*shutdown)(void);

    /* A worker engine whose control plane is pegaflow-server at endpoint ("HOST:PORT"): it maps
       the server's shared pool and does its own copies (transfer 0 host, 1 CUDA on device).
       Every call to the server is bounded by deadline_ms (<= 0: 5000); an unreachable server
       is PF_UNAVAILABLE. All other functions take the handle like an embedded engine's. */
    int32_t (*engine_connect)(const char *endpoint, int32_t copy_threads, int32_t transfer,
                              int32_t device, int64_t deadline_ms, int64_t *out_engine);

    /* The id of the server process behind a connected engine ("" when embedded); it changes
       on every server start. NUL-terminated into buf; *out_len is its length. */
    int32_t (*engine_server_id)(int64_t engine, char *buf, int32_t cap, int32_t *out_len);

    /* ---- The store link of one vLLM process (io.pegaflow.client.StoreLink). ----
       It owns the mode, the embedded engine or the pegaflow-server client, every
       registration made through it and the reconnects: unreachable server = detached
       (lookups miss, loads fail, vLLM recomputes); same server back = re-attached; a
       restarted server = a new client, registrations replayed; an instance the server
       forgot = registered again. mode: "auto" (server when one answers now, else embedded),
       "embedded" or "server"; health_interval_ms: how often a daemon thread checks the server
       (0: never). In server mode an absent server is not an error. ssd: embedded mode's SSD
       tier as lines "ssd_cache_path=DIR" (repeatable) and "ssd_cache_capacity=SIZE"; "" for
       none (since ABI 3). */
    int32_t (*link_open)(const char *mode, const char *endpoint, const char *pool_size,
                         int32_t copy_threads, int64_t deadline_ms, int64_t health_interval_ms,
                         const char *ssd, int64_t *out_link);
    /* Registers a worker through the link (now when a store is there, and again on every new
       server): its instance, then its layers as in register_worker; transfer 0 host copies,
       1 CUDA on device (the first worker decides an embedded engine's copier).
       CHECKED: as in register_worker (GPU regions against their CUDA allocation; host
       regions are the caller's guarantee). */
    int32_t (*link_register_worker)(int64_t link, const char *instance_id, const char *ns,
                                    int32_t tp_size, int32_t world_size, int32_t worker_rank,
                                    int32_t tp_rank, int32_t transfer, int32_t device,
                                    int32_t num_layers, const char *layer_names,
                                    const int64_t *layer_params);
    int32_t (*link_unregister_instance)(int64_t link, const char *instance_id);
    /* Lines "key=value": mode, generation, detached, engine, server_id, registrations. */
    int32_t (*link_status)(int64_t link, char *buf, int32_t cap, int32_t *out_len);
    /* The bound store's stats as JSON (like stats); PF_UNAVAILABLE while none is bound. */
    int32_t (*link_stats)(int64_t link, char *buf, int32_t cap, int32_t *out_len);
    /* Closes the link, its engine or client (copies in flight finish first). */
    int32_t (*link_close)(int64_t link);

    /* ---- The vLLM connector's brain (io.pegaflow.connector), for connector shims. ----
       Both sides are created on a link and read its current engine at every call.
       Scheduler side: one per engine-core process; called from vLLM's scheduler thread. */
    /* groups: the model's KV-cache groups in vLLM's order, one line each (since ABI 4):
       "<kind> <window> <instance_id>", kind 0 full attention, 1 sliding window (window: its
       tokens, vLLM's window plus its retained tokens), 2 recurrent state in vLLM's align mode
       (window 0). Each group is its own store instance (registered with link_register_worker
       under that id), so its blocks hold its layers only. A model with one group: "0 0 <id>".
       load_enabled: 0 no loads (save-only), 1 load, 2 load and wait for the whole prefix
       ("not yet" until it is all there, up to the wait limit): a P/D decode instance; plus 4
       and 8: see "Loads inside the step" below; plus 16: the JVM warms the scheduler side's
       per-request path up on a scratch engine of its own, once per process, on its own thread
       (accepted since ABI 9's wave 3 builds of 2026-12-04; older ones refuse the mode); plus
       32: each load asks the store for its plan itself; without it, where the worker runs in
       this process and the model has one group, the lookup's store call begins the worker's
       load (one round trip to a server before the copy; builds since 2026-12-05). */
    int32_t (*sched_create)(int64_t link, const char *groups, int32_t block_size,
                            int32_t load_enabled, int64_t *out_sched);
    /* get_num_new_matched_tokens: tokens loadable beyond num_computed (0 on a miss or a store
       failure). Side-effect free when repeated with the same inputs (the same hashes,
       compared exactly). */
    int32_t (*sched_lookup)(int64_t sched, const char *req_id, const uint8_t *hashes, int32_t n,
                            int32_t hash_len, int64_t num_tokens, int64_t num_computed,
                            int64_t *out_tokens);
    /* update_state_after_alloc with the request's block tables: counts[g] ids of group g,
       back to back in block_ids (n_groups as in sched_create). */
    int32_t (*sched_after_alloc)(int64_t sched, const char *req_id, const int64_t *block_ids,
                                 const int64_t *counts, int32_t n_groups, int64_t num_external_tokens);
    /* One scheduled request of this step (each group's new block ids appended, or its whole
       table when resumed; counts as in sched_after_alloc); then sched_build_plan once. hashes
       holds n of the request's full-block hashes starting at index hash_offset (pass each
       hash once: the ones not passed before). */
    int32_t (*sched_schedule)(int64_t sched, const char *req_id, const uint8_t *hashes, int32_t n,
                              int32_t hash_len, int32_t hash_offset, const int64_t *new_block_ids,
                              const int64_t *counts, int32_t n_groups, int32_t resumed,
                              int64_t num_computed, int64_t num_scheduled);
    int32_t (*sched_preempted)(int64_t sched, const char *req_id);
    /* build_connector_meta: the step's plan (opaque bytes for every worker). When it does not
       fit cap, PF_INVALID_ARGUMENT with *out_len set; the plan is kept for the next call.
       *out_len 0: the step plans nothing (workers may skip their calls; passed, it does nothing). */
    int32_t (*sched_build_plan)(int64_t sched, uint8_t *buf, int64_t cap, int64_t *out_len);
    /* request_finished: *out_hold = 1 while its blocks must stay until finished_sending. */
    int32_t (*sched_request_finished)(int64_t sched, const char *req_id, int32_t *out_hold);
    /* update_connector_output's invalid_block_ids, before sched_finished: a request whose
       load failed is not offered hits again (recompute, no retry loop). */
    int32_t (*sched_failed_blocks)(int64_t sched, const int64_t *ids, int32_t n);
    /* update_connector_output: '\n'-separated request ids (NULL or "" for none); failed: the
       requests whose load failed (failed_recving: the way a model with several KV-cache
       groups reports it), not offered hits again (since ABI 4). */
    int32_t (*sched_finished)(int64_t sched, const char *sending, const char *recving,
                              const char *failed);
    int32_t (*sched_close)(int64_t sched);

    /* Worker side: one per worker (TP rank). The plan is the scheduler's bytes, decoded once
       per step however many of the three hooks pass it. */
    /* groups: as in sched_create. */
    int32_t (*worker_create)(int64_t link, const char *groups, int32_t worker_rank,
                             int64_t *out_worker);
    int32_t (*worker_start_loads)(int64_t worker, const uint8_t *plan, int64_t len);
    /* wait_for_save: submits the plan's saves ordered after work queued on stream. */
    int32_t (*worker_submit_saves)(int64_t worker, const uint8_t *plan, int64_t len, int64_t stream);
    /* handle_preemptions: returns once saves of the plan's preempted requests finished. */
    int32_t (*worker_await_preempted)(int64_t worker, const uint8_t *plan, int64_t len);
    /* get_finished: lines "S <id>" (saves done) and "R <id>" (load done) into buf. When they
       do not fit (PF_INVALID_ARGUMENT, *out_len set) they are kept for the next call. A
       request whose load failed in any group also has a line "F <id>" (since ABI 4). Last,
       "I -" when nothing is left for a later call to report as of this one (no load in
       flight, no finished request's saves pending): until the host starts loads or passes
       finished ids again it may skip the call (since ABI 9's later builds; a host ignores
       lines of letters it does not know). */
    int32_t (*worker_get_finished)(int64_t worker, const char *finished_ids, char *buf, int32_t cap,
                                   int32_t *out_len);
    /* get_block_ids_with_load_errors: drains the failed destination block ids. */
    int32_t (*worker_load_errors)(int64_t worker, int64_t *out, int32_t cap, int32_t *out_count);
    int32_t (*worker_close)(int64_t worker);
    /* vLLM's connector stats: counters since the last call into out[0..n) (cap >= 10; *out_count
       = n, the lesser of cap and this build's count, 18 now): blocks and bytes loaded, blocks and
       bytes saved, blocks whose load failed, saves that failed, then in-step loads (since ABI 6):
       how many, and nanoseconds to submit them, to finish them, and that the caller waited in
       worker_wait_layer; then (wave 3 builds) nanoseconds to the step's get_finished, of the
       submission's thread hop and of the store's plan, and how many started at allocation
       (sched_create's mode 8); then nanoseconds listing the copy batches' pieces and handing
       them to the copy engine (waiting for a free lane included): most of the submission's
       rest; then nanoseconds from the loads' start until the copy engine queued each one's
       first copy (host copies: began it); then how many loads (in the step or not) read a pool
       side staged from their lookup on (PEGAFLOW_PRESTAGE_MIB). Counters past cap are drained unseen. */
    int32_t (*worker_stats)(int64_t worker, int64_t *out, int32_t cap, int32_t *out_count);

    /* ---- vLLM's prefix-caching block hash, for engines that are not vLLM (since ABI 4). ----
       The hashes of every full block of tokens[0..n_tokens) in blocks of block_size, chained
       from parent (parent_len 0: the request's first block, vLLM's NONE_HASH), exactly as
       vLLM's hash_block_tokens computes them without extra keys (no LoRA, multimodal inputs
       or cache salt), so a native engine and vLLM instances share one namespace. algo: vLLM's
       --prefix-caching-hash-algo, "sha256", "sha256_cbor", "xxhash" or "xxhash_cbor"; seed:
       the PYTHONHASHSEED of those vLLM processes, NULL for vLLM's default (SHA-256 algorithms
       only: without it vLLM's xxhash seeds are random per process). *out_count hashes of
       *out_hash_len bytes (32 SHA-256, 16 xxhash) go to out when they fit cap; else
       PF_INVALID_ARGUMENT with both counts set. Needs no engine. */
    int32_t (*block_hashes)(const char *algo, const char *seed, const uint8_t *parent,
                            int32_t parent_len, const int32_t *tokens, int64_t n_tokens,
                            int32_t block_size, uint8_t *out, int64_t cap, int32_t *out_count,
                            int32_t *out_hash_len);

    /* ---- A native inference engine embedding the store (since ABI 5; docs/embedding.md). ----
       ORDERING: the caller saves only blocks whose compute is ordered before the save: either
       pass the stream that computed them as wait_stream (the copy waits for the work queued on
       it so far) or synchronize first. The engine copies on its own streams and cannot tell.
       REUSE: a GPU block being saved stays untouched (not freed, not rewritten) until its save
       completion is done (poll, wait or callback); a block being loaded into is not read
       before its load completion is done. Freeing a completion early does not cancel the
       copy, and the block is still in use until the copy ends: keep your own guard until the
       callback fires (or flush returns). */

    /* Calls cb(completion, status, user) once when the completion is done: at once on the
       calling thread when it already is, else on the engine thread that finished it. Keep
       the callback short (it holds that copy lane's thread); it may call any function of this
       table except wait on a completion that is not done. The callback fires even when the
       completion was freed before it was done (the copy is never cancelled); then do not pass
       its id to other calls. Several callbacks on one completion all fire. */
    int32_t (*completion_on_done)(int64_t completion, pf_completion_cb cb, void *user);

    /* The visibility barrier (the "KV ready" signal of prefill/decode): returns once every
       save and load this engine started before the call has ended and those saves are
       visible to local queries and, with a cluster (pegaflow-server with --redis), to other
       hosts' queries. timeout_ms < 0: no limit; PF_TIMEOUT names what was still running. A
       failed save is reported on its own completion; the barrier does not fail for it. */
    int32_t (*flush)(int64_t engine, int64_t timeout_ms);

    /* A prefix query owned by the caller's request req_id (1..256 bytes): out_state =
       {state, hit blocks, missing blocks}. PF_QUERY_LOADING: a lower tier (the SSD tier, or
       another host through pegaflow-server) is bringing blocks in, or, with
       PF_QUERY_ALL_OR_NOTHING, the whole prefix is not there yet: no lease; ask again with the
       same req_id and the same hashes (other hashes: PF_INVALID_ARGUMENT, nothing changes).
       PF_QUERY_READY: hit blocks from hash 0 are leased in out_lease (16 zero bytes when the
       hit is 0); the request is done and its id free again. All-or-nothing answers READY with
       every block or, after the wait limit (10 s from the first query), with 0 and missing = n.
       A request never polled again is dropped after 5 minutes; query_cancel drops it now. */
    int32_t (*query_request)(int64_t engine, const char *instance_id, const char *req_id, int32_t n,
                             const uint8_t *hashes, int32_t hash_len, int32_t flags,
                             int32_t out_state[3], uint8_t *out_lease);
    /* Forgets a loading request (admission refused it); *out_was_loading (may be NULL). */
    int32_t (*query_cancel)(int64_t engine, const char *instance_id, const char *req_id,
                            int32_t *out_was_loading);

    /* One rank of an instance in one call: registers the instance (world = tp_size x pp_size;
       again with the same shape: no-op, another shape: PF_TOPOLOGY_MISMATCH) and this rank's
       arenas (worker rank pp_rank x tp_size + tp_rank), sealing the topology when the last
       rank registers. Each arena is a strided region of GPU (or host) memory holding one
       piece of every block; arena_names: n_arenas names separated by '\n' (blocks of a
       namespace are slots sorted by name, so name a page-first layout's arenas in page order,
       e.g. zero-padded, to keep each block one contiguous host run); arena_params: n_arenas x 6
       int64: base address, blocks, block stride, segment bytes, segments (1, or 2 for K and V
       apart), segment stride (V's offset from K; 0 with one segment). Segment s of block b is
       at base + b*stride + s*segment_stride. Several arenas move together under one block id
       (an MLA latent arena and its sidecar: two arenas). The region checked is the reach of
       the last block, (blocks-1)*stride + (segments-1)*segment_stride + segment bytes.
       CHECKED as in register_worker (GPU arenas against their CUDA allocation). */
    int32_t (*register_rank)(int64_t engine, const char *instance_id, const char *ns, int32_t device,
                             int32_t tp_rank, int32_t tp_size, int32_t pp_rank, int32_t pp_size,
                             int32_t n_arenas, const char *arena_names, const int64_t *arena_params);

    /* ---- Loads inside the step (since ABI 6). ----
       sched_create's load_mode may add 4: a hit's load runs in the step that computes the
       request's tail (vLLM's load_kv_async=False; one KV-cache group only). The worker then
       starts loads with worker_start_step_loads (as worker_start_loads; *out_in_step: how many
       run inside this step, copied layer by layer) and, before each attention layer reads its
       KV, calls worker_wait_layer with the layer's index among the registered regions and the
       compute stream: the stream waits for that layer's bytes on the GPU (0: the calling thread
       blocks; pass CU_STREAM_LEGACY, 1, for the legacy default stream, which PyTorch reports
       as 0). worker_get_finished ends the step's in-step loads; a failed one's blocks come
       from worker_load_errors (never as "R" lines). With 4, load_mode may add 8 too: where
       this process holds the instance's worker (the newest created here), such a load
       starts in sched_after_alloc, when vLLM allocated its blocks, and the step's
       worker_start_step_loads takes it up instead of starting it (accepted since ABI 9's
       wave 3 builds; older ones refuse the mode). */
    int32_t (*worker_start_step_loads)(int64_t worker, const uint8_t *plan, int64_t len, int32_t *out_in_step);
    int32_t (*worker_wait_layer)(int64_t worker, int32_t layer, int64_t stream);

    /* ---- Since ABI 7. ----
       vLLM's reset_cache: the instance's namespace's blocks that no lease, load or save holds
       leave the pool, and its SSD records are forgotten (other instances of the namespace lose
       them too). out_counts[0]: blocks dropped from the pool, [1]: SSD records forgotten.
       PF_UNAVAILABLE while the link has no store bound (server down). */
    int32_t (*link_reset_cache)(int64_t link, const char *instance_id, int64_t *out_counts);

    /* ---- Since ABI 8. ----
       The bound store's block events of the instance's namespace after sequence number `after`
       (0: from the oldest kept), at most `max` (1..10,000), for vLLM's KV-event publisher: text,
       a first line "next=N gap=0|1" (N: the `after` of the next call; gap: events were dropped
       from the store's ring since), then one line per event, "S" (stored) or "R" (removed), the
       tier (CPU, SSD, REMOTE) and the block's key in hex. NUL-terminated into buf;
       PF_INVALID_ARGUMENT with *out_len set when it does not fit; PF_UNAVAILABLE while the link
       has no store bound. */
    int32_t (*link_kv_events)(int64_t link, const char *instance_id, int64_t after, int32_t max, char *buf,
                              int32_t cap, int32_t *out_len);

    /* A request's retention hint "low": the n hashes of hash_len bytes packed at `hashes` (n
       checked against its cap first) go first when the pool needs room, until a query hits them
       again; *out_blocks: how many the store held (resident or being saved). PF_UNAVAILABLE while
       the link has no store bound. */
    int32_t (*link_demote)(int64_t link, const char *instance_id, const uint8_t *hashes, int32_t n,
                           int32_t hash_len, int32_t *out_blocks);

    /* ---- Since ABI 9: the tail key and the scheduler side's counters in Java. ----
       sched_lookup with the prompt's partial last block (P/D's tail flow, docs/cluster.md):
       tail_tokens[0..n_tail) (1..65536, checked before they are read) follow the n full blocks;
       the tail's key is derived from the last full block's hash (tail_key below) and looked up
       as one more block; a hit that reaches it answers every prompt token but the last
       (num_tokens - 1 - num_computed), and sched_after_alloc then loads the tail block whole. */
    int32_t (*sched_lookup_tail)(int64_t sched, const char *req_id, const uint8_t *hashes, int32_t n,
                                 int32_t hash_len, const int32_t *tail_tokens, int32_t n_tail, int64_t num_tokens,
                                 int64_t num_computed, int64_t *out_tokens);
    /* The scheduler side's counters since the last call into out[0..min(cap, count)) (cap >= 9;
       *out_count says how many): lookups answered, "not yet" answers, requests offered a hit,
       tokens offered, nanoseconds in lookups, lookups the store failed, waits given up, "not yet"
       answers of a decode instance waiting for its whole prefix, hits shrunk to what every group
       held; then (this build: 25 in all) lookups that began their load, and of the staging at the
       lookup (PEGAFLOW_PRESTAGE_MIB) loads staged, lookups refused because the buffer was
       occupied, because the load was larger than it, stagings failed, lookups refused because the
       buffer could not be had; then hits whose load did not begin at the lookup because no worker
       of the instance runs in this process, or because the engine did not begin it; then stagings
       whose first group was queued, and their nanoseconds from the lookup to the staging thread's
       start, in making the layout, and to that group queued; then stagings whose first group the
       staging thread saw land while pacing them, and their nanoseconds from the lookup to then;
       then the groups the staging thread queued while pacing after it saw the one before them
       land, and the nanoseconds from seeing that to queueing them. A larger cap takes what the
       build has; the ABI is unchanged. */
    int32_t (*sched_stats)(int64_t sched, int64_t *out, int32_t cap, int32_t *out_count);
    /* The key of a prompt's partial last block into out[0..parent_len): the first parent_len
       bytes of SHA-256 over "pegaflow-tail\0", the last full block's key parent (1..32 bytes)
       and the tail's n (1..65536) token ids as 32-bit little-endian integers. */
    int32_t (*tail_key)(const uint8_t *parent, int32_t parent_len, const int32_t *tokens, int32_t n, uint8_t *out);

    /* ---- Appended in ABI 9's wave 3 builds of 2026-12-05. ----
       Starts the process's warm-up of the connector's request path (lookups, allocation, the
       step's plan, in-step loads layer by layer; sched_create's mode bit 16 starts the same) on a
       scratch engine of its own, on a daemon thread, once per process: for vLLM's workers in
       processes of their own (several GPUs). block_size: 1..65536 tokens. *out_started: 1 if
       this call started it, 0 if it had started before (or no thread could be had). */
    int32_t (*warm_up)(int32_t block_size, int32_t *out_started);
} pegaflow_api;

#ifdef __cplusplus
}
#endif

#endif /* PEGAFLOW_H */
