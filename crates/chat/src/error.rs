//! The chat crate's error type.

/// Everything that can go wrong loading a tokenizer or template, or rendering a prompt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// A file that exists could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    /// A `tokenizer.json` (or its sibling configs) is invalid, or encoding/decoding failed.
    #[error("invalid tokenizer: {0}")]
    Tokenizer(String),
    /// The GGUF header lacks or mis-types a `tokenizer.ggml.*` key.
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(String),
    /// A chat template failed to compile or render; carries the template's own message
    /// (e.g. from `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
}

impl From<tokenizers::Error> for ChatError {
    fn from(e: tokenizers::Error) -> Self {
        Self::Tokenizer(e.to_string())
    }
}

impl From<minijinja::Error> for ChatError {
    fn from(e: minijinja::Error) -> Self {
        // The source chain carries detail that the top-level message leaves out.
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        Self::Template(msg)
    }
}
