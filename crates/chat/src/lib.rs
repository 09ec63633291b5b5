//! Text side of the engine: tokenizers (from `tokenizer.json` or a GGUF header), chat
//! templates rendered with minijinja the way transformers does, and incremental
//! detokenization that never splits a UTF-8 character.

mod detokenize;
mod error;
mod gguf_vocab;
mod jinja_compat;
mod template;
mod tokenizer;

pub use detokenize::IncrementalDecoder;
pub use error::ChatError;
pub use template::{ChatTemplate, TemplateInput};
pub use tokenizer::Tokenizer;
