//! The crate's integration tests, one binary (one build and link, and a model loaded once
//! per process instead of once per file).

mod agent_replay;
mod anthropic_python;
mod batches;
mod chat;
mod common;
mod concurrency;
mod conversation;
mod kv_events;
mod openai_python;
mod prefix_cache;
mod reasoning;
mod tools;
