use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConstrainError {
    /// The schema or grammar can't be enforced (an unsupported feature, a contradiction);
    /// the message names what. A client error.
    #[error("{0}")]
    Unsupported(String),
    /// The grammar failed mid-generation (it should have allowed the token it was given).
    #[error("constrained decoding failed: {0}")]
    Failed(String),
    #[error("cannot build the grammar vocabulary: {0}")]
    Vocabulary(String),
}
