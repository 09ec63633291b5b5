//! Turns token ids into generated tokens: the model step, the sampler, the generation loop for
//! one prompt, the engine thread that runs many requests at once, and the prefix cache (in memory,
//! and optionally on disk).

mod bundle;
mod disk_tier;
mod engine;
mod error;
mod generate;
mod output;
mod prefix_cache;
pub mod sampler;
mod sequence;

pub use bundle::{model_fingerprint, ModelBundle};
pub use disk_tier::DiskConfig;
pub use engine::{Engine, EngineConfig, EngineLoad, EngineStopped, ReasoningBudget, SequenceEvent, SequenceRequest, SequenceSummary};
pub use error::{Result, RunnerError};
pub use generate::{generate, FinishReason, GenerationRequest, GenerationStats};
pub use prefix_cache::CacheConfig;
pub use output::{OutputPipeline, ReasoningMode, TextDelta};
