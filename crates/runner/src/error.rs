//! The runner's error type: what can fail between token ids and generated text.

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    #[error(transparent)]
    Model(#[from] spindle_models::ModelError),
    #[error(transparent)]
    Chat(#[from] spindle_chat::ChatError),
    #[error(transparent)]
    Sampling(#[from] crate::sampler::SamplingError),
    #[error("cannot load model: {0}")]
    Load(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(transparent)]
    EngineStopped(#[from] crate::engine::EngineStopped),
    /// The engine ended the sequence with this message.
    #[error("generation failed: {0}")]
    Failed(String),
}

pub type Result<T> = std::result::Result<T, RunnerError>;
