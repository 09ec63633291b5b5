//! The crate's integration tests, one binary (one build and link, and a model loaded once
//! per process instead of once per file).

mod common;
mod gguf_tokenizers;
mod memory;
mod profile;
mod qwen3_5_template;
mod qwen3_5_tokenizer;
mod qwen3_tokenizer;
mod templates;
mod tool_calls;
