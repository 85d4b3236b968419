"""Every bound in raftsched, defined once, with its unit and the reason for it.

A limit that a user can hit is reported by name in the error (problem+json
`limit` member), so "what did I exceed?" always has an answer.
"""

# --- Sharding -----------------------------------------------------------------
# Fixed at cluster creation: a job's shard is stable_hash(job_id) % shard_count.
shard_count_default = 256

# --- Requests -------------------------------------------------------------------
# Whole HTTP request body; a job definition is small, anything larger is a mistake.
request_body_bytes_max = 64 * 1024
# The body a job sends to its target; it is replicated with the job, so it is kept small.
target_body_bytes_max = 32 * 1024
target_headers_max = 32
target_header_value_chars_max = 4096
target_url_chars_max = 2048
job_name_chars_max = 200
idempotency_key_chars_max = 200
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
preview_count_max = 100
retry_max_attempts_max = 100
# Misfire policies: occurrences one fire covers (run under fire_all, recorded
# as missed/skipped otherwise), and the lateness `skip` tolerates by default.
catchup_max_default = 100
catchup_max_max = 1000
misfire_tolerance_s_default = 60.0
misfire_tolerance_s_max = 7 * 24 * 3600.0

# --- Consensus --------------------------------------------------------------------
# How long a write waits for its command to be committed and applied before the
# caller gets 503 (the outcome is then unknown; retry with the same idempotency_key).
propose_timeout_s = 5.0
# Commands queued inside pysyncobj before it refuses more (QUEUE_FULL -> 503).
raft_commands_queue_max = 100_000

# --- Firing -----------------------------------------------------------------------
# Due entries carried by one `fire` command. One Raft entry fires many runs; this
# bounds the entry's size (about 100 bytes an item) and the apply time.
fire_batch_max = 2000
# The trigger loop wakes at the next due instant, or at the latest after this,
# so a missed wake-up never delays a run by more than this.
trigger_tick_ms_max = 200
# Distinct (expression, timezone, after) next-fire results kept in memory.
schedule_cache_max = 65_536
# A cron expression that matches nothing within this many years is refused.
cron_search_years_max = 8

# --- Executing --------------------------------------------------------------------
# Runs executing at once on one node; further runs wait in the dispatcher queue.
runs_inflight_max = 1000
# Runs waiting for an executor on one node; past this the dispatcher drops the
# notification and rescans the open-runs index, so nothing is lost, only delayed.
dispatch_queue_max = 100_000
# Run state changes per `run_updates` command, and how often the batch is sent.
run_update_batch_max = 1000
run_update_period_ms = 20
# Run state changes waiting to be proposed while there is no leader.
run_update_pending_max = 200_000
# Short error summary kept in the replicated run record.
run_error_chars_max = 500
# Response body read from an HTTP target (only its head is kept, in the error).
http_response_head_bytes_max = 4096
# Output kept per stream (stdout, stderr, HTTP response body) per attempt; the
# rest is dropped and the kept text says how much was dropped.
output_bytes_max = 64 * 1024
# A command's process group gets SIGTERM on timeout or cancel, then SIGKILL
# after this grace.
command_kill_grace_s = 2.0
# Per-node output store (storage/output_store.py): total size and age bounds.
output_store_bytes_max = 1024 ** 3
output_retention_s = 7 * 24 * 3600
# Runs of one job waiting under the `queue` concurrency policy (concurrency.queue_max).
concurrency_queue_max_default = 100
concurrency_queue_max_max = 1000
# Open runs of one job under `allow`; past this an occurrence is recorded skipped
# (each open run is listed in the job record, which every replica rewrites).
job_active_runs_max = 1000

# --- Topics (publish targets) -------------------------------------------------------
# Messages kept per topic, and for how long; the oldest go first.
topic_messages_max = 100_000
topic_retention_s = 7 * 24 * 3600
# Old messages one publish may trim, so one apply stays bounded.
topic_trim_per_publish_max = 64
# Messages one read returns, and the longest a read may wait for new ones.
topic_read_limit_max = 1000
topic_wait_s_max = 30.0
topic_name_chars_max = 100


# --- Retries and commands -----------------------------------------------------------
# Longest retry.base_s / retry.max_s a job may ask for.
retry_delay_s_max = 24 * 3600.0
command_argv_max = 256

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
# Circuit breaker per target host: open when failure_ratio of the last window
# calls failed; stay open cooloff_s, then let one call through.
breaker_window = 20
breaker_failure_ratio = 0.9
breaker_cooloff_s = 30.0
# A worker's claim waits at most this long for a run (long poll), and claims
# at most this many runs at once.
worker_claim_wait_s_max = 30.0
worker_claim_max = 100
# A node asking another for the output it keeps gives up after this.
logs_fetch_timeout_s = 2.0
