//! The Redis cache in front of the status table, one module per scenario (feature
//! `redis`): hits, misses, namespaces, signed entries, outages and stalls.

#[path = "../support/mod.rs"]
mod support;

mod redis_batch_respects_handler_cache_arguments;
mod redis_databases_sharing_one_redis_keep_apart;
mod redis_duplicate_is_answered_from_cache;
mod redis_entries_are_namespaced;
mod redis_failed_key_is_not_cached;
mod redis_fingerprint_is_checked_on_hit;
mod redis_forged_entry_never_skips_a_body;
mod redis_garbage_entry_falls_back_to_postgres;
mod redis_handler_cache_ttl;
mod redis_handler_can_opt_out;
mod redis_lease_mode_uses_cache;
mod redis_outage_falls_back_to_postgres;
mod redis_postgres_duplicate_warms_cache;
mod redis_stalled_server_does_not_block;
mod redis_time_bucketed_scope_is_answered_from_cache;
mod redis_ttl_expiry_leaves_correctness_to_postgres;
mod redis_unreachable_at_start_is_harmless;
