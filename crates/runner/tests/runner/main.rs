//! The crate's integration tests, one binary (one build and link, and a model loaded once
//! per process instead of once per file).

mod chunking_keys;
mod common;
mod conversation;
mod disk_tier;
mod draft_model;
mod dropped_prefill;
mod failures;
mod faults;
mod kv_types;
mod preemption;
mod prefix_cache;
mod reasoning_budget;
mod reference;
mod speculation;
mod speculation_hybrid;
mod speculation_mtp;
mod window_rows;
