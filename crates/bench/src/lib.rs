//! Client-side benchmarks of the agent workload, and an evaluation of server behaviour, against
//! any OpenAI-compatible server.
//!
//! Coding agents send a long, fixed system prompt (rules and tool definitions) with every
//! call and change only the last user message. A server with a prefix cache answers such a
//! call in the time of the new tokens; one without it re-reads the whole prompt each time.
//! Three panels show which (modules of the same names):
//!
//! - **agentic**: a cold call, the same call again, [`PREFIX_CALLS`] calls with the same system
//!   prompt and new user text, and (when the caller can restart the server) one more after a
//!   restart, repeated `runs` times. The headline is the verdict on `median(prefix)/cold` of the
//!   time to first token.
//! - **burst**: N concurrent calls sharing a warmed system prompt: errors and 429s, latency
//!   percentiles, how many calls re-read the whole prompt, aggregate and per-request tokens/s,
//!   and whether the calls ran one after another.
//! - **conversation**: one growing agent conversation (each call adds a tool call and its
//!   result): per call the tokens read and the latency, and how the cost grows with depth.
//! - **speculation**: decode speed and draft acceptance with speculative decoding on and off,
//!   on a whole-file edit, a tool call that quotes its context, and prose.
//!
//! [`eval`] is the pass/fail suite of server behaviour (`spindle eval`): stop strings, limits,
//! logprobs, tool calls, structured output, reasoning, the prefix cache, seed parity,
//! concurrency isolation, error codes, CORS and usage, each check with what it expected and
//! what it got.
//!
//! [`gates`] watches the server while a panel runs (early stops, memory, KV occupancy, other
//! busy processes); [`report`] prints the terminal tables, [`json`] and [`html`] write the
//! files of a run ([`results::Results`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), spindle_bench::BenchError> {
//! use spindle_bench::agentic::agent_calls;
//! use spindle_bench::{report, AgenticPanel, Client, Workload};
//!
//! let mut client = Client::new("http://127.0.0.1:8080", None)?;
//! client.discover_model().await;
//! let workload = Workload::prepare(&client, 42, 2150, 16).await;
//! let panel = AgenticPanel { runs: vec![agent_calls(&client, &workload).await?] };
//! report::agentic_table(&panel).iter().for_each(|l| println!("{l}"));
//! report::verdict_lines(&panel).iter().for_each(|l| println!("{l}"));
//! let run = spindle_bench::burst::run_burst(&client, &workload, 0, 8).await?;
//! println!("{}", report::burst_line(&run, workload.system_tokens.value()));
//! # Ok(())
//! # }
//! ```

pub mod agentic;
pub mod burst;
pub mod cli;
mod client;
pub mod conversation;
mod error;
pub mod eval;
pub mod gates;
pub mod html;
pub mod json;
pub mod prompt;
pub mod quality;
pub mod report;
pub mod results;
pub mod schema;
pub mod speculation;
mod sse;
pub mod stats;
pub mod svg;
mod workload;

pub use agentic::{AgenticPanel, Phase, PhaseKind, Verdict, PREFIX_CALLS};
pub use burst::{BurstLevel, BurstRun, BurstStats, REREAD_SLACK_TOKENS};
pub use client::{Client, SESSION_HEADER};
pub use error::BenchError;
pub use sse::{parse_payload, CallTracker, ChunkInfo, Measurement, Payload, SseDecoder};
pub use workload::{TokenCount, Workload};
