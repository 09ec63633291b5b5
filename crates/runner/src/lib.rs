//! Turns token ids into generated tokens: the model step, the sampler and the generation loop.

mod bundle;
mod error;
mod generate;
pub mod sampler;

pub use bundle::ModelBundle;
pub use error::{Result, RunnerError};
pub use generate::{generate, FinishReason, GenerationRequest, GenerationStats};
