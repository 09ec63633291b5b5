//! The chat crate's error type.

use crate::jinja_compat::TemplateException;

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
    /// A file read as GGUF has no GGUF header, or a damaged one.
    #[error("{path} is not a valid GGUF file: {reason}")]
    BadGguf { path: std::path::PathBuf, reason: String },
    /// The GGUF header lacks or mis-types a `tokenizer.ggml.*` key.
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(String),
    /// A chat template failed to compile or render by itself (a fault of the template).
    #[error("chat template: {0}")]
    Template(String),
    /// The chat template refused its input with its own `raise_exception`; carries the
    /// template's message (e.g. "Conversation roles must alternate user/assistant").
    #[error("the chat template refused the conversation: {0}")]
    TemplateRaised(String),
}

impl From<tokenizers::Error> for ChatError {
    fn from(e: tokenizers::Error) -> Self {
        Self::Tokenizer(e.to_string())
    }
}

impl From<minijinja::Error> for ChatError {
    fn from(e: minijinja::Error) -> Self {
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            if let Some(raised) = s.downcast_ref::<TemplateException>() {
                return Self::TemplateRaised(raised.0.clone());
            }
            source = s.source();
        }
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
