//! The chat crate's error type.

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    #[error("cannot read {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("invalid tokenizer: {0}")]
    Tokenizer(String),
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(String),
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
        // The detail chain carries the template's own message (e.g. from raise_exception).
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        Self::Template(msg)
    }
}
