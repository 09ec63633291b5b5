//! Turns token ids into generated tokens: the model step, the sampler, the generation loop for
//! one prompt, and the engine thread that runs many requests in turn.

mod bundle;
mod engine;
mod error;
mod generate;
mod output;
pub mod sampler;

pub use bundle::ModelBundle;
pub use engine::{Engine, EngineConfig, EngineLoad, EngineStopped, ReasoningBudget, SequenceEvent, SequenceRequest, SequenceSummary};
pub use error::{Result, RunnerError};
pub use generate::{generate, FinishReason, GenerationRequest, GenerationStats};
pub use output::{OutputPipeline, ReasoningMode, TextDelta};
