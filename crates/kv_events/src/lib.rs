//! KV-cache events as vLLM publishes them and llm-d's precise prefix-cache scorer reads them
//! (`vllm/distributed/kv_events.py`, llm-d-kv-cache's `pkg/kvevents`): which blocks of 16
//! tokens a replica holds, so a router sends a prompt where its prefix is cached.
//!
//! Every message on the PUB socket has three frames: the topic (`kv@<pod>@<model>`), an 8-byte
//! big-endian sequence number, and a msgpack `EventBatch` `[timestamp, [event...], dp_rank]`
//! ([`wire`]). A subscriber that sees a gap asks the replay socket (ROUTER) for the batches
//! from a sequence number on; it answers each with `[seq, payload]` and ends with `[-1, ""]`.
//!
//! The engine hands each step's events to [`Publisher::publish`], which never blocks: a full
//! queue drops the batch (a slow subscriber misses messages, and can ask for them again while
//! they are in the replay window), it does not slow inference.

mod publisher;
pub mod wire;

pub use publisher::{Bound, Publisher, PublisherConfig};
pub use wire::{BlockHash, KvEvent, Medium};
