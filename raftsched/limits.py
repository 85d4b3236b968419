"""Every bound in raftsched, defined once, with its unit and the reason for it.

A limit that a user can hit is reported by name in the error (problem+json
`limit` member), so "what did I exceed?" always has an answer.
"""

# --- Sharding -----------------------------------------------------------------
# Fixed at cluster creation: a job's shard is stable_hash(job_id) % shard_count.
shard_count_default = 256
# Due and shard keys pack the shard as an unsigned 16-bit integer.
shard_count_max = 65_536

# --- Keys and commands ------------------------------------------------------------
# LMDB refuses an empty key and a key longer than this (its compiled-in
# MDB_MAXKEYSIZE), in bytes. Tx and both stores refuse such keys.
lmdb_key_bytes_max = 511
# Every string that becomes part of a storage key is bounded in UTF-8 bytes (and
# may not contain NUL, the separator of composed keys), so that every composed
# key stays within lmdb_key_bytes_max. The longest layouts: open runs (node | run,
# 128 + 1 + 128 = 257 bytes), idempotency keys (tenant | key, 64 + 1 + 256 = 321)
# and ready runs (tenant/queue | priority | ms | run, 64 + 1 + 100 + 1 + 1 + 8 + 128
# = 303). tests/test_commands.py
# checks every layout at these bounds.
key_part_bytes_max = 128
job_id_bytes_max = key_part_bytes_max
# A run's id names its job and time (keys.run_id: "run_", a marker, the job
# id, and up to 16 hex digits), so it is longer than the longest job id by those.
run_id_bytes_max = job_id_bytes_max + len("run_~") + 16
# A due entry's key: its shard (2 bytes), time (8), kind (1) and a job or run
# id. The LMDB store keeps the rest of the key after the shard and the
# entry's encoded value (a tenant and a rank) as one LMDB value, which LMDB
# bounds as it bounds keys (storage/lmdb_store.py).
due_key_bytes_max = 2 + 8 + 1 + run_id_bytes_max
execution_id_bytes_max = key_part_bytes_max
node_id_bytes_max = key_part_bytes_max
worker_id_bytes_max = key_part_bytes_max
# A run's holder: a node id, or "worker:" and a worker id.
holder_bytes_max = len("worker:") + worker_id_bytes_max
tenant_bytes_max = 64
idempotency_key_bytes_max = 256
# Topic, group and worker queue names (1-100 of [A-Za-z0-9._-], so chars are bytes).
topic_bytes_max = 100
group_bytes_max = 100
queue_bytes_max = 100
# Free text a command carries (errors, reasons, addresses): in no key, but
# replicated to every node and kept in records.
command_text_bytes_max = 4096
# Nesting depth of the free-form values a command carries (metadata, messages,
# target bodies): deeper is a mistake or an attack, and checks recurse this deep.
command_nesting_max = 32
# Integers a command carries as times (ms since the epoch), tokens, offsets and
# versions: what a signed 64-bit integer holds, so that a time plus a delay still
# fits the unsigned 64-bit fields of keys.
command_int_max = 2 ** 63 - 1
# Attempt numbers a command may carry: far above retry_max_attempts_max, and an
# unsigned 16-bit integer.
run_attempt_max = 65_535

# --- Requests -------------------------------------------------------------------
# Whole HTTP request body; a job definition is small, anything larger is a mistake.
request_body_bytes_max = 64 * 1024
# The longest request line (method, path and query) and header line a node
# reads; past it the request is refused (400 problem+json naming this limit)
# before any handler runs (api/problems.py ProblemAppRunner). aiohttp's own
# default, named here.
request_line_bytes_max = 8190
# The body a job sends to its target; it is replicated with the job, so it is kept small.
target_body_bytes_max = 32 * 1024
target_headers_max = 32
target_header_value_chars_max = 4096
# Target and alert URLs, in UTF-8 bytes (commands carry free text of at most
# command_text_bytes_max; a URL longer than this is a mistake anyway).
target_url_bytes_max = 2048
job_name_chars_max = 200
# Encoded size of `metadata`: it is replicated to every node.
metadata_bytes_max = 4096
# Bounds on a target call's timeout (seconds).
target_timeout_s_min = 0.1
target_timeout_s_max = 3600.0
target_timeout_s_default = 30.0
# `every` schedules: shorter than a second cannot be kept on time; longer than
# a year is better written as cron.
every_ms_min = 1000
every_ms_max = 366 * 24 * 3600 * 1000
# run_at further ahead than this is almost certainly a unit mistake (ms vs s).
run_at_ahead_ms_max = 10 * 366 * 24 * 3600 * 1000
# Page sizes of list endpoints.
list_limit_default = 50
list_limit_max = 500
# Rows one page of GET /v1/jobs reads at most (the table holds every tenant's
# jobs): a page may come back short, with a cursor to go on from.
list_scan_rows_max = 10_000
# Rows a listing reads per store scan while filling a page (api/history.py): a
# scan holds an LMDB read, so a filtered page reads in such slices.
list_scan_chunk_rows = 256
preview_count_max = 100
# Fire times a schedule preview (of a job, or of a schedule given) lists when
# the request gives no `count`.
preview_count_default = 10
retry_max_attempts_max = 100
# Misfire policies: occurrences one fire covers (run under fire_all, recorded
# as missed/skipped otherwise), and the lateness `skip` tolerates by default.
catchup_max_default = 100
catchup_max_max = 1000
misfire_tolerance_s_default = 60.0
misfire_tolerance_s_max = 7 * 24 * 3600.0
# Nesting depth (objects and arrays) of a request's JSON. It is checked before
# the body is parsed, so no parser recursion depends on the caller. A job body
# holds metadata and target bodies one or two levels down, and commands carry
# those at most command_nesting_max deep.
json_depth_max = 32
# Integers in a request (JSON or query): the signed 64-bit range that commands
# carry (command_int_max) and msgpack, keys and every replica handle alike.
json_int_max = command_int_max
json_int_min = -command_int_max - 1
# A worker's completions carry each attempt's output (output_bytes_max per
# stream), so that route takes larger bodies than the rest of the API.
worker_complete_body_bytes_max = 4 * 1024 * 1024
# The latest instant a request may name (9999-12-30T00:00:00Z, in ms): Python's
# datetime ends with the year 9999, and a day of margin keeps that instant's
# local time representable in every zone.
timestamp_ms_max = 253_402_128_000_000
# Jobs in one POST /v1/jobs:batchCreate: 1000 typical jobs (about 300 bytes
# each as a command) make about 300 KB of Raft entries (see batch_entry_jobs_max).
batch_create_jobs_max = 1000
# Jobs one create_jobs Raft entry carries; a larger batch is proposed as several
# entries. Each replica's Raft thread applies an entry in one go (about 80 ms of
# CPU per 1000 jobs, decoding included) and sends no heartbeat meanwhile; on a
# busy machine a 1000-job entry held a leader's thread past the 0.4 s election
# timeout, so entries stay at a quarter of that.
batch_entry_jobs_max = 250
# The longest a request handler computes on the event loop before it lets
# other requests and the node's loops run (seconds): batchCreate checks its
# jobs in slices of about this long, so a maximal batch never stalls the node.
loop_slice_s = 0.01
# The body of a batchCreate. 1000 typical job bodies take about 400 KB of JSON;
# this leaves room for larger ones (an average of 4 KB a job) while keeping the
# Raft entry a batch makes within a few MB.
batch_request_body_bytes_max = 4 * 1024 * 1024
# A job's `secret_keys` (core/redact.py): names of headers or env variables whose
# values reads, output and alerts show as "***". More names than a target holds
# headers is a mistake; a name is a header or variable name, short in practice.
# Both are replicated with the job.
secret_keys_max = 64
secret_key_bytes_max = 256
# A job's `labels` ({key: value}, filtered on by GET /v1/jobs?label=key:value):
# replicated with the job, so few and short, as Kubernetes bounds them. Keys are
# 1-63 bytes of [A-Za-z0-9._/-] (no ":", which separates key from value in a
# filter); values 0-63 bytes of text without control characters.
job_labels_max = 32
label_key_bytes_max = 63
label_value_bytes_max = 63
# `label=` filters one list request may give (all must match).
label_filters_max = 8
# The note a pause may carry (`:pause {"note"}`), kept in the job until resume.
pause_note_bytes_max = 1024
# A job's `jitter_s`: the most a stable per-occurrence delay may add to each fire.
# An hour spreads hourly jobs over the whole hour; more is a different schedule.
jitter_s_max = 3600
# `misfire.catchup_window_s`: how far back a late fire catches up, at most a year
# (the longest gap between two occurrences of an `every` schedule).
catchup_window_s_max = 366 * 24 * 3600
# A list's opaque page token, in characters: a few integers, an id and a filter
# digest encoded as base64; anything longer is not one of ours and is not decoded.
page_token_chars_max = 512

# --- DAG workflows (core/dag.py, core/dagrun.py) -----------------------------------
# Tasks of one DAG job. A DAG run keeps an instance of every task (about 200
# bytes each) in its run record, which every replica rewrites each time one of
# its tasks starts, retries or ends; the job's spec holds every task's target
# within request_body_bytes_max. A purge of a DAG run removes its task runs too.
dag_tasks_max = 100
# Dependencies (edges) of one DAG job, over all its tasks: each is scanned when
# one of its upstream tasks ends, and checked on every replica when the job's
# command is decoded.
dag_edges_max = 1000
# A task id: 1-64 of [A-Za-z0-9._-] (ASCII, so characters are bytes). It is
# shown in reads and hashed into its task runs' ids and execution ids.
dag_task_id_bytes_max = 64

# --- Consensus --------------------------------------------------------------------
# How long a write waits for its command to be committed and applied before the
# caller gets 503 (the outcome is then unknown; retry with the same idempotency_key).
propose_timeout_s = 5.0
# How long (seconds) a write or a consistent read arriving while no leader is
# reachable from this node (an election after the leader died) waits for one
# before it answers 503 no_leader: an election takes 0.4-1.4 s
# (election_timeout_min_s..max_s), one with split votes about twice that, and a
# client would rather wait that long than retry. A command is proposed only once
# a leader is reachable: a write that waited is proposed once, and one refused
# at this bound was not proposed at all.
leader_wait_s = 3.0
# How often (seconds) that wait looks again; a look reads two fields of Raft state.
leader_wait_poll_s = 0.02
# A write that is not committed within propose_timeout_s is waited for longer
# while the cluster is visibly committing (this node's applied index moved in
# the last propose_timeout_s, and a leader is reachable): it is queued behind
# other entries, not lost. This bounds that longer wait (seconds); admission
# (below) keeps the queue short enough that it is not reached.
propose_wait_max_s = 30.0
# Admission (runtime/admission.py): what a node takes from its clients before it
# refuses more, with 503 `busy`, Retry-After and this limit's name, and without
# proposing. Write requests (each a waiter and its command held in memory) this
# node has proposed, or is about to, and not yet answered:
writes_inflight_max = 1024
# Jobs of creates (single or batch) this node has admitted and not yet
# answered. Every node admits its own, and the leader commits them all: three
# nodes' 4,000 jobs are about 2 s of apply on a loaded 2-core machine (each
# replica applies every job), well within propose_timeout_s, where 32 batches
# of 1,000 at once took more than 5 s. At least batch_create_jobs_max, so a
# whole batch is admitted on an idle node.
create_jobs_inflight_max = 4000
# The same for one tenant's creates on one node: a tenant that floods a node
# with batches leaves the others at least create_jobs_inflight_max minus this
# (1000 jobs) of room. At least batch_create_jobs_max.
create_jobs_inflight_per_tenant_max = 3000
# Creates are refused (busy) while this node carries batch_create_jobs_max
# jobs of creates in flight and its log trails by more than this many
# seconds: by the wait of its oldest create in flight, or by its latest
# renewal's round trip, proposal to applied here (Coordinator.log_latency_s),
# which every node's creates delay. The bounds above are per
# node, and three nodes' creates together kept the log over a second behind
# on two cores: every renewal queued behind them, and shard leases lapsed
# (runs not called) under creates alone. A renewal (every renew_period_s) is
# applied within node_lease_s - shard_lease_margin_s (1.25 s) while the log
# trails by less than 0.75 s; this leaves room for what was admitted before
# the trail was seen (docs/benchmarks.md, "Creates that kept the log behind").
create_log_latency_max_s = 0.3
# Seconds a client refused as busy is told to wait (Retry-After): about what
# the admitted work takes to commit.
busy_retry_after_s = 1
# The busy refusals of a node are logged at most once per this many seconds
# (with how many there were): one line per episode, not one per request.
busy_log_period_s = 10.0
# Group commit of single creates (runtime/admission.py CreateGroups): single
# POST /v1/jobs of one tenant, token and quota that arrive while this node has
# create entries in flight wait for one to finish and go out together as one
# create_jobs entry. This many of those entries at once, per node: two keep
# the Raft pipeline busy while the next group gathers. A group is at most an
# entry of batchCreate (batch_entry_jobs_max jobs, batch_entry_bytes_max bytes).
create_groups_inflight_max = 2
# Commands queued inside pysyncobj before it refuses more (QUEUE_FULL -> 503).
raft_commands_queue_max = 100_000
# A Raft frame's declared length (bytes, after pysyncobj's 4-byte length
# header) before the connection has authenticated: the first frame is a random
# key (about 200 bytes encrypted) or a node's address. An HTTP request or a
# probe declares far more ("GET " reads as 542 MB), and pysyncobj would buffer
# all of it; a longer declaration closes the connection (replication/raft.py).
raft_frame_preauth_bytes_max = 4 * 1024
# The same once authenticated. The largest frames are a follower forwarding
# one command to the leader: a batch create entry of at most a few MB
# (batch_request_body_bytes_max), pickled, compressed and encrypted, which
# makes 1 MB of incompressible command a 1.6 MB frame (measured). Append
# entries and snapshots travel in chunks of 64 KiB. So 64 MiB is eight times
# the worst case and still bounds what one peer connection can hold.
raft_frame_bytes_max = 64 * 1024 ** 2
# Seconds a connection to the Raft port has to finish its handshake (its first
# frame decrypted with the secret, then the peer's address) before it is
# closed. A peer does both in one round trip (milliseconds); pysyncobj itself
# closes an idle connection only when it next has an event on it, so a
# connection that sends nothing, or a byte now and then, would stay forever.
raft_handshake_timeout_s = 5.0
# Connections to the Raft port from one source address that have not finished
# their handshake. A peer opens one link at a time (a redial replaces the old
# one), so a few cover peers behind one address (a relay, NAT, one host in
# tests); more from one address are closed as they are accepted.
raft_preauth_connections_per_source_max = 8
# The same across all sources: bounds what unauthenticated connections can hold
# (each at most raft_frame_preauth_bytes_max buffered, for
# raft_handshake_timeout_s) however many addresses they come from.
raft_preauth_connections_max = 256
# Bytes of Raft log a node holds since its last snapshot before it takes one,
# whatever --raft-snapshot-entries says (batch creates write about 100 KB an
# entry): 1/raft_log_snapshot_share of its last snapshot's size, at least
# raft_log_bytes_min and at most raft_log_bytes_max (replication/raft.py
# log_bytes_bound). A snapshot copies the whole state, so a bound that grows
# with it keeps the copying per byte written the same at any size; the price
# is journal disk, and a restart reads more journal (the entries the LMDB
# state already holds are skipped, not applied again). The log is in the journal file, not in memory. A leader takes such an
# early snapshot only while every follower has the entries it would drop
# (else a lagging follower would need the whole state sent): then it holds
# more, up to raft_log_bytes_hard_max (the journal's offsets are 32-bit).
raft_log_bytes_min = 64 * 1024 ** 2
raft_log_bytes_max = 1024 ** 3
raft_log_snapshot_share = 8
raft_log_bytes_hard_max = 2 * 1024 ** 3

# pysyncobj's timing (replication/raft.py), in seconds: how often a leader sends
# append entries while followers lack entries or the commit index (the commit
# batching: a commit waits at most this for its send); how often it sends bare
# heartbeats while they lack nothing (a quarter of the shortest election
# timeout: three can be lost or late before a follower stands; etcd's ratio
# is a tenth, and an idle node's CPU is mostly these); and how long the Raft
# thread's loop waits for the network at most (a queued command wakes it at
# once, so this bounds only its timers: election deadlines, connection
# retries, snapshot checks); the election timeout range a
# follower waits without hearing a leader (wide enough that two candidates
# rarely collide, short enough that failover stays under two seconds); and how
# long a leader that hears from no majority keeps acting as leader.
append_entries_period_s = 0.01
heartbeat_period_s = 0.1
auto_tick_period_s = 0.05
# How long one turn of the Raft thread waits at most when no timer of its own
# is due sooner (a leader's next send, a follower's election deadline): what
# else a turn does (connection retries, the journal's meta file once a second,
# snapshot checks) may wait this long. A follower that hears its leader every
# heartbeat_period_s turns when it hears it, not also every auto_tick_period_s.
raft_turn_wait_max_s = 0.2
# A follower's turn waits until this long (seconds) past its election
# deadline, which pysyncobj tests as passed only when strictly before now.
raft_deadline_slack_s = 0.001
# A Raft frame whose pickled message is at most this many bytes goes stored
# in its zlib stream, not compressed (replication/raft.py zlib_frame): the
# heartbeats and acknowledgements, where compressing costs 65 us a frame and
# saves a few bytes.
raft_frame_stored_bytes_max = 1024
election_timeout_min_s = 0.4
election_timeout_max_s = 1.4
leader_fallback_timeout_s = 2.0
# How often a node dials a peer it is not connected to (pysyncobj's default is
# 5 s). A restarted node, or one back from a partition, is otherwise not
# sent entries or a snapshot for up to that long; a dial is one connect().
connection_retry_s = 1.0
# The longest the Raft thread applies entries in one tick before it handles
# the network again (seconds; one entry may take longer); well under the
# election timeout, so that applying a backlog never looks like a dead leader.
apply_budget_s = 0.05
# Entries applied in one tick share one LMDB transaction (an LMDB commit costs
# about 100 us, more than a small entry's apply) until they have taken this
# long; then they are committed and the next share another. A commit lets go
# of the interpreter lock, which the event loop waits for: a longer batch
# made the loop's calls wait (docs/benchmarks.md, "One LMDB transaction for
# several entries"). Seconds, by the Raft thread's clock.
apply_batch_max_s = 0.002
# Raft log entries between snapshots (default of --raft-snapshot-entries); a
# snapshot copies the whole state, so this trades journal size and restart
# replay time against snapshot frequency. A node also snapshots at least this
# often (seconds) once it has entries to compact.
log_compaction_entries_default = 20_000
log_compaction_period_s = 600
# How often the journal is flushed to disk in every --fsync mode (seconds): the
# most of the journal a power loss can take from one machine in `periodic`.
journal_flush_period_s = 1.0
# How often LMDB is fsynced (seconds) under --fsync periodic, to match the
# journal's flush (see storage/lmdb_store.py on durability).
store_sync_period_s = 1.0
# Raft connections closed for a declared length over the cap are logged at most
# once in this many seconds (a port scan must not flood the log), with a count.
frame_refusal_log_period_s = 10.0
# A peer silent for this long (seconds) loses its shards: three renewals
# (renew_period_s) and fifteen idle Raft heartbeats, so many missed answers,
# and it keeps failover inside 3 s.
node_lease_s = 1.5
# How often (seconds) the leader's coordinator re-checks liveness and placement
# (it bounds how late a lapsed lease is noticed); and how often each node renews
# its liveness: one small Raft entry each time, which every replica applies, so
# the renewals of an idle cluster are most of its Raft traffic. A third of the
# lease leaves two renewals that may be lost or late (a loaded machine) before
# a live node lapses; renewing more often moves no shard sooner.
coordinator_period_s = 0.25
renew_period_s = node_lease_s / 3
# The coordinator reads and plans every shard only when the Raft term or the
# candidate nodes changed since a pass that found the placement right, and at
# least this often (seconds) regardless (runtime/coordinator.py).
placement_recheck_period_s = 5.0
# A node's shard lease, on its own monotonic clock: it holds its shards (and
# the runs fired in them, which it calls without a `start` entry) until
# node_lease_s after it proposed its latest renewal that it has seen applied,
# less this margin (seconds). The leader judges the node dead node_lease_s
# after it applied that renewal, which is later than it was proposed; the
# margin covers the two monotonic clocks' drift over a lease (well under 1 ms
# at 500 ppm) and a call that begins right at the lease's end (one coordinator
# period), so a node frozen past its lease never calls when it wakes.
shard_lease_margin_s = 0.25
# After a node's own process starts, how much longer than a lease (and its
# margin) it gives each other node to renew before judging it dead (seconds,
# by the renewals' cluster times). A cluster restarted whole connects its
# links over the first seconds: a dial that finds its peer not listening yet
# is tried again connection_retry_s later, so the node slowest to start may be
# reached, and its renewal committed, only after two dials. Judged a lease
# after the leader's start, it lost its shards to the first placement pass,
# and the runs it held were called again by their new owners rather than
# judged by their misfire policies on it. A node that does not come back
# after such a restart loses its shards this much later.
start_liveness_grace_s = 2 * connection_retry_s
# Open runs of one shard a new owner takes over in one entry (run ids): a
# `take_over_runs` entry rewrites each run, so it is bounded as the reaper's are.
take_over_batch_max = 1000
# Renewals of one node proposed and not yet applied here: a renewal is
# proposed every renew_period_s without waiting for the one before, so that
# a slow round trip under load does not space them out; past this many in
# flight (a lease's worth) the node is cut off or the log far behind, and
# more would only queue.
renewals_inflight_max = 6
# How long a shard's new owner waits, after it gained the shard, before it
# takes over the shard's open runs (seconds). A former owner that is alive
# but slow (its renewals late under load, or its shards rebalanced) may have
# called runs whose finishes are still on their way through the log: taken
# over at once, they would be called twice with no fault. Waiting this long
# lets those finishes land first (the former owner calls nothing more of the
# shard once it has applied the reassignment). It is what a run's lease
# (run_lease_ms_default) gave before the lease was taken at fire. A former
# owner the new one judges dead (Coordinator.live_nodes) is not waited for,
# nor are runs fired ahead and not due yet (take_over_armed_margin_ms).
take_over_grace_s = 5.0
# Shards whose runs a node takes over (or hands over) at once, each in its own
# Raft entry: one after another, a node that gained 85 shards took 4 s (a
# commit each, loaded) to reach the last one's runs.
take_over_shards_at_once = 32
# A node stopped with SIGTERM drains first, for at most this long (seconds; a
# second signal ends it at once; SIGINT stops it without draining): it asks
# to be given no shards (its clock answers say it is draining, and the leader
# places shards on the others), hands the runs it holds and has not called to
# their shards' new owners as the same attempts, lets its calls in flight end
# and sends their finishes. Past it, it stops as a killed node would leave things: its runs
# are taken over as next attempts. About twice take_over_grace_s, after which
# the new owners call a live former holder's runs again anyway.
stop_drain_max_s = 10.0
# How often a draining node looks whether it is done (seconds).
stop_drain_poll_s = 0.05
# A draining node is done only once a renewal of its own proposed this long
# (seconds) after it began draining has been applied: by then the leader has
# read `draining` in its clock answer (it asks every clock_probe_period_stable_s,
# waiting at most clock_probe_timeout_s) and placed shards once more without
# it, and any shards it gave the node before that are in the node's state.
# Without it, a node stopped just after shards were given back to it took
# itself for drained before it applied them, and their runs, handed to it
# uncalled, were called again as next attempts once it was gone.
drain_settle_s = 1.75
# How long a node waits before it sends again the finish of a run it holds
# that was not applied (dropped at run_update_pending_max, or its batch
# refused), in seconds: a node-executed run has no lease that would expire
# and retry it, so its holder keeps reporting until the finish is applied.
finish_resend_s = 1.0
# A shard's new owner takes over at once (without take_over_grace_s) the runs
# fired ahead of their second that are not due by its clock with this much to
# spare (ms): no node calls a run early, so none of them can have been called.
# The margin covers the two nodes' estimates of the cluster's time, which
# differ by at most their measurement errors (docs/operations.md, "Clocks").
take_over_armed_margin_ms = 1000
# Recorded digest checks a node keeps, for callers comparing replicas; and
# digests computed at once (each holds an LMDB read open, so pages stay pinned);
# a check past this records no digest at its index, and the caller asks again.
checked_digests_kept = 64
digests_computing_max = 4

# How often (seconds) a consistent read polls until this node has applied the
# leader's commit index: a catch-up takes a few ms, and the poll is one integer read.
consistent_read_poll_s = 0.002
# How often (seconds) a digest request polls for a digest being computed.
digest_wait_poll_s = 0.01
# A node whose registration could not be committed (no quorum yet) proposes it
# again after this (seconds).
node_register_retry_s = 0.5
# GET /v1/cluster asks every peer for its status; one that has not answered
# within this (seconds) is listed as unreachable, so the view stays quick.
cluster_peer_status_timeout_s = 0.5
# A node calls its peers' APIs through one client (runtime/peer.py PeerClient):
# at most this many connections open at once, to all peers together, each kept
# alive this long (seconds) after its last call, longer than the slowest of the
# periodic callers (clock probes, the storage guard's checks) waits, so that
# they reuse their connections rather than open one a call.
peer_connections_max = 64
peer_keepalive_s = 30.0

# --- Cost of a Raft entry (core/cost.py) --------------------------------------------
# The most one Raft entry a proposer builds from tenants' work (a fire, a batch
# of run reports, a backfill step, a lease-expiry batch, a purge) may cost
# apply, in cost units: one unit is about one run record created or
# rewritten, 30-45 us of CPU of a replica's Raft thread (docs/benchmarks.md,
# "Cost of one Raft entry"). Each replica applies an entry in one go and
# sends no heartbeat meanwhile, so this keeps such an entry under about 50 ms
# of CPU, far under election_timeout_min_s, whatever the jobs behind it are (a
# fire of DAG jobs of dag_tasks_max tasks each included). What does not fit
# goes in the next entry, in order. It also bounds one job's catch-up after
# an outage (core/cost.py catchup_fitting): a plain job's catchup_max_max
# occurrences fit.
apply_entry_cost_max = 1024
# An entry whose apply takes more CPU than this (seconds) is logged as slow
# on every replica: twice what apply_entry_cost_max is sized for.
apply_entry_slow_s = 0.1
# The most bytes of job commands one create_jobs entry carries (a batchCreate
# is proposed as several entries past this or batch_entry_jobs_max): encoding,
# decoding and storing each byte is apply's work too.
batch_entry_bytes_max = 256 * 1024

# --- Firing -----------------------------------------------------------------------
# Due entries carried by one `fire` command. One Raft entry fires many runs; this
# bounds the entry's size (about 100 bytes an item) and the apply time.
fire_batch_max = 2000
# --arm-ahead-s: a shard's owner fires an occurrence this many seconds before
# it is due (its run is "armed": created, held in the owner's memory, called
# at its second), so the Raft and LMDB work of a top-of-hour spike is spread
# over the seconds before it. 0 fires at the due second (no arming). The
# default is measured (docs/benchmarks.md, "Firing ahead of the second"): a
# 10,000-run burst is armed well within it on a loaded 2-core machine.
arm_ahead_s_default = 30.0
# The flag's bound: an armed run is withdrawn by any edit made before its
# second, and held in memory until then; a window of minutes only widens both.
arm_ahead_s_max = 300.0
# A node keeps in its data folder a time no run it called was due after
# (runtime/horizon.py): before a call due past it, the file is pushed this far
# past the call's due time (one fdatasync). Runs it held that were due after
# the time the file gave at its start, and whose second passed while it was
# down, were never called, and their jobs' misfire policies judge them. Larger
# means fewer writes, and runs due just after a stop called late rather than judged.
call_horizon_step_ms = 5_000
# How long a node at its start waits for its shard lease (and every node's
# release to apply the judgement) before the runs it never called are called
# late instead of judged by their misfire policies; it calls nothing meanwhile.
uncalled_judge_wait_s = 60.0
# Then, how long it waits to hear that every node's release applies the
# judgement (clock answers come every clock_probe_period_unmeasured_s until each
# peer is measured): a node of an earlier release in the cluster, during a
# rolling upgrade, holds this node's calls back no longer than this.
uncalled_level_wait_s = 1.5
# Items fired ahead of their second in one pass of a node's trigger, proposed
# only while none of its fires is in flight: arming is a background pipeline of
# small entries, so followers apply each quickly and keep answering heartbeats
# while creates and calls share the log (a 2000-item entry of armed runs beside
# a burst of creates cost leader elections on a loaded 2-core machine).
arm_fire_items_max = 250
# Armed runs one node holds in memory (runtime/armed.py), about 1 kB each
# with the run record. Past it the trigger arms nothing more and fires at the
# due second, as with --arm-ahead-s 0, until armed runs are called.
armed_runs_max = 200_000
# The trigger loop wakes at the next due instant, or at the latest after this,
# so a missed wake-up never delays a run by more than this.
trigger_tick_ms_max = 200
# Distinct (expression, timezone, after) next-fire results kept in memory.
schedule_cache_max = 65_536
# A cron expression as given (bytes, before macros and H are resolved). What a
# person writes fits in a few dozen; a long list of values costs milliseconds
# to parse and to evaluate at every fire, so past this it is refused (400,
# schedule.cron). The longest plain expression (every value of every field
# listed) is longer, but a range or a step says the same in a few bytes.
cron_expression_bytes_max = 256
# Distinct cron expressions whose check (parse and validation) is kept in
# memory: a batch of jobs that share an expression parses it once.
cron_parse_cache_max = 4096
# A cron expression that matches nothing within this many years is refused.
cron_search_years_max = 8

# The trigger loop re-reads its owned shards and their next due instants from
# LMDB this often (seconds), in case an in-memory update was missed.
due_resync_period_s = 5.0
# Steps one walk forward from a look-back point may take to find a schedule's
# latest occurrence before an instant (core/schedule.py): bounds the CPU of one
# evaluation; a minutely schedule over the longest look-back (366 d) is 527,040
# steps, which the shorter windows tried first avoid.
schedule_walk_steps_max = 100_000

# --- Executing --------------------------------------------------------------------
# Runs executing at once on one node; further runs wait in the dispatcher queue.
runs_inflight_max = 1000
# Runs waiting for an executor on one node; past this the dispatcher drops the
# notification and rescans the open-runs index, so nothing is lost, only delayed.
dispatch_queue_max = 100_000
# Run state changes per `run_updates` command, and how often the batch is sent.
run_update_batch_max = 1000
run_update_period_ms = 20
# Reports of one tenant a node has proposed and not yet seen answered, in as
# many batches as they fill: another tenant's report never waits for this bound,
# and finds at most these ahead of it in the log (from this node).
run_update_inflight_reports_max = 256
# The same bound while only one tenant has reports waiting or in flight on this
# node: no other tenant's report can be behind them.
run_update_inflight_reports_solo_max = run_update_batch_max
# A batch's size while several tenants' reports wait: small enough that a light
# tenant's few starts commit without waiting for a heavy one's hundreds.
run_update_fair_batch_max = 64
# How long a batch that did not commit (no quorum) waits before it goes again.
run_update_retry_s = 0.5
# Run state changes waiting to be proposed while there is no leader.
run_update_pending_max = 200_000
# Calls come first: while runs wait on this node for a dispatcher slot (more
# than runs_inflight_max due at once), the finish of a successful call that
# nothing waits on (no DAG task, no retry, a job whose concurrency policy is
# allow) is held back, and sent when no run waits any more, or once it has
# waited this long (seconds), in batches of run_update_batch_max (and at once
# when a shard moves to another node, so that they land within its
# take_over_grace_s). During a
# spike every replica then spends its CPU on calls, and applies their finishes
# after them. A node killed meanwhile loses the finishes it held: their runs
# are called again by the shard's new owner (at least once, with the same
# execution id), as for a call in flight when a node dies.
finish_hold_max_s = 10.0
# The most finishes one node holds that way; past it the oldest
# run_update_batch_max go at once (a whole entry, rather than one finish per
# new one: in a 100K burst, entries of tens took 7-11% more of the nodes' CPU
# per run while calling than entries of a thousand). A run
# called and not yet reported is one the shard's next owner calls again if
# the shard moves (a node that died, froze or was cut off mid-spike; a node
# alive and working keeps its shards): the bound keeps that number to about
# what a node calls in finish_hold_max_s on two cores (900 calls a second),
# so that the two bounds meet. Measured (docs/benchmarks.md): 10K burst call
# p99 2.1-2.4 s held to 4,000, 2.4-3.0 s to 2,000, 3.6-3.7 s with none held;
# 100K burst call p99 39.3-40.9 s held to 4,000, 35.6-37.0 s to 8,000.
finishes_held_max = 8000
# How often held finishes are looked at (seconds): whether calls still wait.
finish_hold_check_s = 0.05
# Short error summary kept in the replicated run record.
run_error_chars_max = 500
# The exit code a worker may report for an attempt: a C int (negative for a
# signal), as the run record stores it.
exit_code_min = -(2 ** 31)
exit_code_max = 2 ** 31 - 1
# Response body read from an HTTP target (only its head is kept, in the error).
http_response_head_bytes_max = 4096
# Connections one node keeps open to one host (scheme, host, port), and calls it
# makes to one host at once: further runs for that host wait in the dispatcher,
# tenants in turn, not yet called (their timeout not running), until one of
# those calls ends. Keep-alive reuses them: a burst of a thousand calls to one
# webhook then opens this many connections, not a thousand, which costs both
# ends a TCP handshake and a socket each.
http_connections_per_host_max = 100
# Output kept per stream (stdout, stderr, HTTP response body) per attempt; the
# rest is dropped and the kept text says how much was dropped.
output_bytes_max = 64 * 1024
# A command's process group gets SIGTERM on timeout or cancel, then SIGKILL
# after this grace.
command_kill_grace_s = 2.0
# Per-node output store (storage/output_store.py): total size and age bounds,
# and the most one tenant's output may take of it (at its bound a tenant loses
# its own oldest output): a quarter, so that one tenant, or one worker posting
# outputs, cannot fill the node's store and evict every other tenant's.
output_store_bytes_max = 1024 ** 3
output_store_tenant_bytes_max = output_store_bytes_max // 4
output_retention_s = 7 * 24 * 3600
# Runs of one job waiting under the `queue` concurrency policy (concurrency.queue_max).
concurrency_queue_max_default = 100
concurrency_queue_max_max = 1000
# Open runs of one job under `allow`; past this an occurrence is recorded skipped
# (each open run is listed in the job record, which every replica rewrites).
job_active_runs_max = 1000
# Shortest secret value masked in an attempt's output and error, in characters.
# A shorter one ("1", "on") would mask ordinary text everywhere and, by where it
# did, tell what it is; such a value is masked in job reads only.
secret_redact_chars_min = 4
# Re-drives of one failed run (POST /v1/runs/{id}:retry). Each may add up to
# retry.max_attempts attempts to the run record, which every replica rewrites on
# every report, and attempt numbers stay far below run_attempt_max.
run_redrives_max = 10
# The highest attempt number a run reaches: retry.max_attempts attempts, and as
# many again after each re-drive. What a worker's report may name.
run_attempts_max = retry_max_attempts_max * (run_redrives_max + 1)

# After a command's process group is killed, how long (seconds) to wait for
# pipes that a stray process (one that left the group) may still hold open.
pipe_drain_after_kill_s = 1.0
# `raftsched worker`: the wait of one claim long poll (seconds; a node holds the
# request this long when idle, under worker_claim_wait_s_max), and the pause
# after every node failed to answer before trying them all again.
worker_claim_wait_s = 20.0
worker_unreachable_pause_s = 0.5
# What a worker's request may take (seconds) beyond the node's own wait (the
# claim's long poll, the commit's propose_timeout_s) before it gives up on that
# node: the network and a busy node's queue.
worker_request_slack_s = 5.0

# `raftsched worker`: how often (seconds) a worker with every slot busy looks
# again for a free one; and the slots it runs when --concurrency is not given.
worker_slot_poll_s = 0.05
worker_concurrency_default = 4
# `raftsched worker` stopped with SIGTERM drains: it claims nothing more, lets
# the commands it runs end (heartbeating their leases) and reports them, for
# at most --drain-s seconds (this default, at most the max), then kills what
# is left, as a stop without a drain does (the cluster retries those runs).
worker_drain_s_default = 30.0
worker_drain_s_max = 3600.0

# --- Topics (publish targets) -------------------------------------------------------
# Messages kept per topic, and for how long; the oldest go first.
topic_messages_max = 100_000
topic_retention_s = 7 * 24 * 3600
# Old messages one publish may trim, so one apply stays bounded.
topic_trim_per_publish_max = 64
# Messages one read returns, and the longest a read may wait for new ones.
topic_read_limit_max = 1000
topic_wait_s_max = 30.0
# Messages one read returns when it gives no `limit`.
topic_read_limit_default = 100
topic_name_chars_max = 100
# Encoded bytes of the messages kept per topic (each message as stored, with its
# offset, key and execution id); past it the oldest go, as for the count bound.
# Topics are replicated to every node: topics_max * this is the most they hold.
topic_messages_bytes_max = 16 * 1024 ** 2
# Topics of one tenant, and in the cluster: a publish to a new topic past
# either fails the run, not retried. Topics are not removed, so topics_max is a
# hard cap on the topic tables; a tenant reaches its own bound first, so it
# takes ten tenants at theirs to fill the cluster's.
topics_per_tenant_max = 100
topics_max = 1000
# Consumer groups per topic: a commit to a new group past it answers 409.
groups_per_topic_max = 1000

# --- Retries and commands -----------------------------------------------------------
# Longest retry.base_s / retry.max_s a job may ask for.
retry_delay_s_max = 24 * 3600.0
command_argv_max = 256
# Exit codes a job's retry.non_retryable_exit_codes may list: there are only
# 256, and the list is replicated with the job.
non_retryable_exit_codes_max = 64

# --- Leases, reaper, alerts, circuit breaker ------------------------------------------
# A running attempt's lease: its holder extends it every heartbeat period; the
# leader's reaper ends an attempt whose lease ran out (retry, or failed when
# attempts are spent). Node settings --run-lease-s / --run-heartbeat-s.
run_lease_ms_default = 5000
run_heartbeat_ms_default = 1000
# How often the leader's reaper looks for expired leases and orphaned runs.
reaper_period_ms = 500
# Leases or runs one reaper command carries.
reaper_batch_max = 1000
# Deliveries of one failure alert before it is recorded undeliverable; the
# wait between them doubles from alert_retry_base_s.
alert_attempts_max = 8
alert_retry_base_s = 1.0
alert_timeout_s = 10.0
# Circuit breaker per tenant and target host: open when failure_ratio of the last window
# calls failed; stay open cooloff_s, then let one call through.
breaker_window = 20
breaker_failure_ratio = 0.9
breaker_cooloff_s = 30.0
# (tenant, target host) pairs the breaker keeps a window for (one breaker per
# tenant and host, so one tenant's failures never hold back another's calls);
# past it the least recently called is forgotten, so hosts named by jobs cannot
# grow a node's memory.
breaker_tenant_hosts_max = 10_000
# Open breakers GET /v1/node lists by name (it counts them all).
breakers_listed_max = 20
# The longest a node holds a run back behind its tenant's open breaker for the
# run's host: past it the run is called anyway, once per attempt, so that a
# host that never answers again ends its runs by their retry policy (and
# alerts) rather than holding them open for ever.
breaker_hold_max_s = 3600.0
# A worker's claim waits at most this long for a run (long poll), and claims
# at most this many runs at once.
worker_claim_wait_s_max = 30.0
worker_claim_max = 100
# Names long polls wait on at once on one node, in each of its two maps (topic
# readers by topic, worker claims by queue): a name's entry lives while someone
# waits on it. Per tenant, so one tenant's many names never take another's room;
# per node, so all of them bound the node's memory (an entry is a few hundred
# bytes). A wait on a new name past either answers 429 with Retry-After.
waited_names_per_tenant_max = 1000
waited_names_max = 10_000
# A wait refused past those is asked to come back after this (seconds, the
# Retry-After): a long poll ends within its wait_s, most far sooner.
waited_names_retry_after_s = 1
# A node asking another for the output it keeps gives up after this.
logs_fetch_timeout_s = 2.0

# --- Retention and storage ------------------------------------------------------------
# Finished runs kept per job (the job's history.max_runs, else the cluster's
# --history-max-runs), and the most a job may ask for: the purger keeps each
# job's newest finished runs and removes older ones, a batch at a time.
history_max_runs_default = 1000
history_max_runs_max = 100_000
# Age of a finished run (since it finished) past which it is removed
# (history.max_age_s, else --history-max-age-s); and the longest a job may ask for.
history_max_age_s_default = 30 * 24 * 3600
history_max_age_s_max = 366 * 24 * 3600
# Deleted jobs and completed ones (one-offs that ran) are removed with their runs
# this long after they were deleted or completed (--finished-job-retention-s).
finished_job_retention_s_default = 7 * 24 * 3600
# An idempotency key stays reserved this long after the create that used it,
# even when its job is deleted or removed (--idempotency-ttl-s).
idempotency_ttl_s_default = 24 * 3600
# The shortest a node's seconds flag (--history-max-age-s, --finished-job-
# retention-s, --idempotency-ttl-s) may be: they are kept in milliseconds.
flag_duration_s_min = 0.001
# The leader's purger: how often it passes, and how many items (runs, jobs,
# idempotency keys) one `purge` command removes; a pass that fills its batch is
# followed at once by the next, so a backlog drains at several batches a second.
purge_period_ms = 1000
purge_batch_max = 1000
# Records one purger pass reads, so a pass stays short on the leader: jobs
# visited (each costs a job read and a few history entries), history entries
# read per job, and idempotency keys visited. A job is revisited at least every
# jobs / purge_scan_jobs_max passes.
purge_scan_jobs_max = 1000
purge_scan_runs_per_job_max = 2000
purge_scan_idem_max = 2000
# After a round of passes that went through every table and found nothing to
# remove, the purger rests until the earliest time a record it read can pass a
# bound, and at most this long (seconds), reading meanwhile only the jobs that
# entries applied since wrote: a cluster with a large history reads what
# changes in it.
purge_rest_max_s = 300.0
# Jobs written since a round began that a resting purger keeps to visit; past
# it, the rest ends and the purger goes round every job again.
purge_touched_jobs_max = 10_000
# The LMDB map (--max-data-bytes): the most state a node can hold. LMDB's file is
# sparse and grows with use, so this is address space; the disk is guarded by
# --min-free-disk-bytes.
max_data_bytes_default = 64 * 1024 ** 3
max_data_bytes_min = 1024 ** 2
# Writes that add state (create, update, trigger, resume, a new consumer group)
# answer 507 once the state uses this share of max_data_bytes, or once the data
# disk has less than --min-free-disk-bytes free. The rest of the map is headroom
# for what goes on regardless: firing, finishing runs, deletes (each also adds an
# audit record) and purges, and LMDB's copies of the pages they change while a
# read (a snapshot being written) still holds the old ones.
data_bytes_high_water_ratio = 0.8
min_free_disk_bytes_default = 1024 ** 3
# How often a node measures its state's size and its disk's free space (both
# cheap), and asks its peers whether they are past their marks; a peer's
# answer counts for storage_peer_report_s. Every storage_check_period_s while
# this node's state changes size, or this node or a peer is within a few
# seconds of its mark at
# storage_fill_rate_bytes_per_s (the most a node is taken to write a second:
# well over what a node applies, batchCreates at full speed included); at
# most storage_check_period_max_s apart while every node has room for that
# long (the checks and peers' answers were a fifth of an idle node's CPU).
storage_check_period_s = 1.0
storage_check_period_max_s = 10.0
storage_fill_rate_bytes_per_s = 64 * 1024 ** 2
storage_peer_report_s = 5.0

# History entries the purger reads per page while walking one job's runs,
# oldest first: the first page is one run, because most jobs have nothing to
# purge and the walk stops at their oldest finished run (a page of 8 decoded
# 8 runs of a recurring job to read one: a pass over its jobs took three
# times as long); pages then double.
purge_page_runs_first = 1
purge_page_runs_max = 256
# A peer that does not answer a storage check this fast (seconds) is skipped
# for this check; its last answer counts for storage_peer_report_s.
storage_peer_timeout_s = 0.5
# How often old run output is pruned (seconds); it is also bounded in size at
# each put.
output_prune_period_s = 600.0
# The output store's keys (storage/output_store.py): LMDB refuses keys over
# 511 bytes, and a by_tenant key is tenant (at most tenant_bytes_max, 64) + 1
# + 8 + run_id + 3 bytes.
output_run_id_bytes_max = 511 - tenant_bytes_max - 1 - 8 - 3
# Deletions per write transaction when pruning output. A week of expired output
# can be millions of records; one transaction for all of them would hold the
# write lock and pin dirty pages throughout, so the pruner commits every this many.
output_prune_txn_records_max = 10_000
# The output store's map size, in multiples of its bytes bound, and at least
# output_map_bytes_min: records just over a page take two 4 KiB overflow pages,
# and freed pages are reused only once older readers finish, so the file can be
# a few times the bound. The map is address space (a sparse file on Linux).
output_map_size_factor = 4
output_map_bytes_min = 64 * 1024 ** 2
# The state's LMDB map when a store is opened without --max-data-bytes (tests,
# tools): address space, not disk, on Linux. Nodes pass --max-data-bytes.
lmdb_map_size_default = 8 * 1024 ** 3
# Records a pinned read (a snapshot, a digest) yields between checks for a
# snapshot install that needs it gone; and bytes one copy step moves when
# installing a snapshot where copy_file_range is not available.
snapshot_abort_check_records = 1024
# A node opening a state of an earlier schema rewrites what changed in write
# transactions of at most this many entries (LMDB bounds the pages one write
# transaction may change: 10M due entries do not fit in one).
schema_migrate_txn_entries = 100_000
snapshot_copy_chunk_bytes = 1024 ** 2

# --- Backfill (core/backfill.py, runtime/backfiller.py) ------------------------------
# Occurrences one backfill runs. The node that answers the request computes them
# all, on a thread (one cron evaluation each: 0.2-0.5 ms measured on a busy
# 2-core machine, so 2-5 s at the bound), and a dry run lists them; a year of
# an hourly schedule is 8,784.
backfill_occurrences_max = 10_000
# A backfill's runs open at once (its `max_concurrent`, default 1): each open
# run is listed in the backfill's record, which every step rewrites.
backfill_concurrent_max = 100
backfill_concurrent_default = 1
# Backfills running at once, in the cluster and per tenant: the leader's
# backfiller looks at every running one each pass, so the cluster bound bounds
# a pass; the tenant bound keeps one tenant from taking every slot.
backfills_open_max = 64
backfills_open_per_tenant_max = 8
# Backfill records kept, running and finished (a finished one is removed
# --finished-job-retention-s after it ended), per tenant and in the cluster; a
# create past either answers 409. A tenant reaches its own bound first, so it
# takes ten tenants at theirs to fill the cluster's.
backfills_per_tenant_max = 1000
backfills_max = 10_000
# How often the leader's backfiller passes (ms): a slot a finished run freed
# is refilled within about this.
backfill_period_ms = 200
# While no backfill runs, the leader's backfiller waits for one to begin
# (apply's BackfillOpened) instead of passing; it looks again this often
# (seconds) all the same, as a bound on anything that began unannounced.
backfill_idle_recheck_s = 5.0
# Runs one backfill_step entry may create, over all its backfills: the entry is
# applied in one go on every replica's Raft thread (see batch_entry_jobs_max).
backfill_step_runs_max = 250
# Backfill records one purger pass reads.
purge_scan_backfills_max = 1000

# --- Supervision of background tasks (runtime/supervise.py) ------------------------
# A loop that raises is restarted after a backoff that doubles from the min to the
# max (seconds): short enough that a one-off fault costs the trigger loop a tenth
# of a second, long enough that a fault on every pass does not spin a core.
task_restart_backoff_s_min = 0.1
task_restart_backoff_s_max = 5.0
# Failures in a row after which the process exits (about 20 s of backoff): a
# node whose trigger, dispatcher or renewals cannot run must give up its shards
# and runs to the others rather than hold them.
task_failures_consecutive_max = 10
# A loop that ran this long (seconds) before it failed starts the count afresh.
task_healthy_run_s = 60.0

# While stopping, how often (seconds) tasks still running are cancelled again.
task_stop_recancel_s = 0.1
# A node that stops lets the HTTP requests in flight finish for this long
# (seconds), then cancels them (aiohttp's shutdown_timeout, 60 s by default).
# Long polls (worker claims, topic reads) are answered at once as it stops.
http_stop_grace_s = 3.0
# `raftsched dev`: how long (seconds) a node may take to stop cleanly before it
# is killed, and the longest wait before a node that exited is restarted (the
# wait doubles from half a second).
dev_stop_grace_s = 10.0
dev_restart_delay_s_max = 10.0

# How often (seconds) `raftsched dev` looks for nodes that exited.
dev_supervise_poll_s = 0.2

# --- Tokens, tenants, quotas and the audit table (docs/security.md) ----------------
# The mode of the folders a node makes for its state, Raft journal, snapshots
# and run outputs (and, without the x bits, of the files LMDB makes in them):
# its own user only, whatever the umask, since they hold every tenant's jobs
# and secrets. The node also runs with umask 077 (runtime/procguard.py).
private_dir_mode = 0o700
# Tenant names: 1-63 of [a-z0-9_-], starting with a letter or digit (so they fit
# tenant_bytes_max and contain neither NUL nor the "/" that scopes topic and queue
# names by tenant).
tenant_name_pattern = r"[a-z0-9][a-z0-9_-]{0,62}"
# Tokens and tenants the cluster keeps (replicated to every node; each is small).
tokens_max = 10_000
tenants_max = 10_000
token_name_bytes_max = 128
# A token's secret, in random bytes: 256 bits, twice the 128 that guessing needs.
token_secret_bytes = 32
# The bootstrap admin token an operator gives (RAFTSCHED_ADMIN_TOKEN): at least
# this many characters, so a short guessable word is refused.
admin_token_chars_min = 24
# The shared Raft secret (RAFTSCHED_RAFT_SECRET, --raft-secret-file): as long
# as the admin token, for the same reason; it is also what the node credential
# (runtime/peer.py) is derived from.
raft_secret_chars_min = admin_token_chars_min
# Audit records are kept in streams, each dropping only its own oldest
# (core/tenancy.py), so one tenant's writes never evict the admin's records or
# another tenant's: the admin's stream (tokens, tenants, what admin tokens did)
# keeps its newest audit_admin_entries_max; a tenant's, its newest
# audit_entries_per_tenant_max. While the tenants' streams hold more than
# audit_entries_max records together, a tenant's new record drops its own oldest,
# down to audit_entries_kept_min. So the table holds at most
# audit_admin_entries_max + audit_entries_max + tenants_max * audit_entries_kept_min.
audit_admin_entries_max = 100_000
audit_entries_per_tenant_max = 10_000
audit_entries_max = 100_000
audit_entries_kept_min = 100
audit_list_limit_max = 1000
# Quota defaults for a tenant without its own (node flags --tenant-*; give every
# node the same). jobs_max counts jobs not deleted (active, paused, completed
# ones until they are purged); creates_per_s refills a token bucket that holds
# tenant_create_burst_s seconds of creates; runs_concurrent_max bounds the runs a
# tenant has executing on one node; weight is its share where a backlog forms.
tenant_jobs_max_default = 10_000_000
tenant_creates_per_s_default = 100_000
tenant_create_burst_s = 1.0
# Half a node's slots by default: one tenant's backlog leaves the other half free
# for the others.
tenant_runs_concurrent_max_default = runs_inflight_max // 2
tenant_weight_default = 1
tenant_weight_max = 1000
quota_jobs_max_max = 10 ** 12
quota_creates_per_s_max = 10 ** 9
# Deficit round robin between tenants (trigger, dispatcher): items a tenant of
# weight 1 takes per round. Larger rounds cost fairness, smaller cost CPU.
fair_quantum = 64
# A node's trigger keeps at most this many of one tenant's due items in fires not
# yet committed (proposed in fair order when several tenants wait): the log never
# holds a heavy tenant's whole backlog ahead of another tenant's runs, nor ahead
# of its own starts and finishes.
fire_inflight_items_max = 64
# The same bound while only one tenant has items due or in flight on this node:
# no one waits behind its entries, so it may fill the pipeline (two full
# `fire_many` entry). When a second tenant's item comes due, the first
# proposes nothing more until its items in flight fall under
# fire_inflight_items_max.
fire_inflight_items_solo_max = fire_batch_max

# --- Clocks (runtime/clock.py, core/clocks.py) ----------------------------------------
# A node whose wall clock is further than this from the cluster's time (the
# median of the nodes' clocks) owns no shards (--max-clock-skew-ms). Half a
# second: far beyond what NTP leaves (milliseconds), far inside what a broken
# NTP daemon or a wrong manual setting causes.
max_clock_skew_ms_default = 500
max_clock_skew_ms_max = 3_600_000
# A node out of bound gets shards again once its offset is within this share
# of the bound, so a clock that sits at the bound does not move shards to and fro.
clock_rejoin_ratio = 0.9
# How often a node measures each peer's clock (one small HTTP exchange each):
# while every node's clock is judged within the bound (a step of a wall clock
# changes no firing, which runs on the cluster's time carried forward on the
# monotonic clock, and is judged within this and a round trip); while a node
# is out of bound or not yet judged (so a clock put right gets shards back
# soon); and while it has not yet measured every registered peer, so a new or
# restarted node may fire soon after its peers answer.
clock_probe_period_stable_s = 1.0
clock_probe_period_s = 0.5
clock_probe_period_unmeasured_s = 0.1
# An exchange slower than this is abandoned: its error bound (half the round
# trip) would be too wide to judge a clock by.
clock_probe_timeout_s = 0.5
# Exchanges kept per peer; the one with the smallest error bound is used.
clock_samples_kept = 8
# A peer not measured for this long no longer counts towards the median (a
# dead or removed node); its last verdict stands.
clock_sample_age_s_max = 10.0
# How fast two clocks may drift apart, in parts per million, widening an old
# sample's error bound: 500 ppm is the most an NTP daemon slews a clock.
clock_drift_ppm_max = 500
# While a node's own clock stays out of bound, it says so again this often (seconds).
clock_skew_log_period_s = 30.0

# How often (seconds) the clock's test seam (RAFTSCHED_TEST_CLOCK_SHIFT_FILE)
# re-reads its file: often enough that a test's clock step shows at once.
clock_test_shift_reread_s = 0.05

# --- Client and CLI (raftsched/client, raftsched/cli_ops.py) -------------------------
# A client call with no answer within this long (seconds) fails as a cluster
# error. Past the API's own 5 s commit wait, with room for a slow node; a long
# poll (topic read, worker claim) adds its own wait_s to it.
client_timeout_s_default = 30.0
# Node URLs a client or the CLI is given at most (`url=` or RAFTSCHED_URL,
# comma-separated): each is tried in turn when the one before does not answer.
client_urls_max = 16
# How often `raftsched jobs backfill` and `raftsched runs logs --follow` read the
# progress again (seconds): a person watches it, so once a second is enough.
cli_poll_period_s = 1.0
# A list of jobs sent in batches (raftsched.client.bulk, `raftsched jobs
# create -f`): how long one batch is sent again while a node refuses it
# `busy` (nothing proposed), or, when every job of
# the batch carries an idempotency key, that got no answer or an unknown
# outcome (seconds); and the longest wait between two sends, whatever a
# Retry-After says.
batch_resend_s = 120.0
batch_resend_wait_max_s = 5.0
# Rows `raftsched jobs list` and `runs list` ask for when --limit is not given:
# a screenful; --page-token reads on.
cli_list_limit_default = 50

# HTTP target hosts a node's address policy judged callable, remembered so that
# each is parsed once (executors/netguard.py AddressPolicy.check_url); past
# this many the memory starts over. Hosts, each at most a URL's host.
callable_hosts_known_max = 4096
# Answers of keys.execution_id (a sha256) and of keys.run_id remembered, each:
# both are made again on reads and writes of a run record, several times in
# its life on a node. The recent runs'. Entries.
run_ids_remembered_max = 8192
# X-Raftsched-Scheduled-For header values remembered (executors/http.py): a
# burst's runs share a few due seconds. Entries.
scheduled_for_remembered_max = 1024
# Target URLs whose parts (the breaker's host, the connection pool's key) a
# node's dispatcher remembers (runtime/dispatcher.py): each call reads them
# three times, the last calls' URLs are the ones asked for again. Entries.
url_parts_remembered_max = 1024

# Allocations between collections of the young generation in a node process,
# once it has started (runtime/gcpolicy.py; CPython's default is 700). With the
# start's objects frozen, a 20,000-run burst took 22 s of node CPU at 10,000
# against 29 s at the defaults, and the same peak memory (docs/benchmarks.md,
# "The cyclic garbage collector"). Objects.
gc_young_threshold = 10_000
