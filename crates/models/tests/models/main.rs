//! The crate's integration tests, one binary (one build and link, and a model loaded once
//! per process instead of once per file).

mod common;
mod gguf_types;
mod hybrid_reference;
mod mtp_head;
mod paged_kv;
mod safetensors;
mod yarn_reference;
