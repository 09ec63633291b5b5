//! The runner's error type: what can fail between token ids and generated text. Some failures
//! are the request's own (it can never fit, its grammar has no way on); the rest are faults of
//! the engine or the model.

/// The engine thread has stopped (it only does when its handle is dropped or it panicked).
#[derive(Debug, thiserror::Error)]
#[error("the engine thread has stopped")]
pub struct EngineStopped;

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
    /// A draft model whose tokens are not the target's: its drafts would spell other text.
    #[error("the draft model {draft} cannot draft for {target}: their vocabularies differ ({difference})")]
    DraftVocabulary { draft: String, target: String, difference: String },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(transparent)]
    EngineStopped(#[from] EngineStopped),
    /// The prompt leaves its context no room for a generated token. The request's fault.
    #[error("the prompt is {prompt} tokens but the context holds {context}")]
    PromptExceedsContext { prompt: usize, context: usize },
    /// The prompt needs more KV positions than the whole pool holds, so it could never run.
    /// The request's fault (or a pool sized too small for it).
    #[error("the prompt is {prompt} tokens but the KV cache holds {kv_tokens}")]
    PromptExceedsKvPool { prompt: usize, kv_tokens: usize },
    /// The answer's grammar (a JSON schema, the tool calls) allows no next token: what the
    /// request asked the answer to follow cannot be satisfied from where it got to.
    #[error("the answer's grammar allows nothing more: {0}")]
    GrammarDeadEnd(String),
    /// A fault of the engine or the model (a failed step, a panic, a broken invariant); the
    /// detail is for the log.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, RunnerError>;
