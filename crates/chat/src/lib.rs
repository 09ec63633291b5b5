//! Text side of the engine: tokenizers (from `tokenizer.json` or a GGUF header), chat
//! templates rendered with minijinja the way transformers renders them with Jinja2, and
//! incremental detokenization that never splits a UTF-8 character. Generated answers are
//! read back for tool calls in the format the model writes them (`ToolCallParser`). What a
//! server needs to know about a model's chat format is read once, at load (`ModelProfile`).
//!
//! A request goes through it like this:
//!
//! ```no_run
//! # fn main() -> Result<(), spindle_chat::ChatError> {
//! use spindle_chat::{ChatTemplate, IncrementalDecoder, TemplateInput, Tokenizer};
//!
//! let tok = Tokenizer::from_tokenizer_json("model/tokenizer.json".as_ref())?;
//! let template = ChatTemplate::from_tokenizer_config("model/tokenizer_config.json".as_ref(), &tok)?
//!     .unwrap_or_else(ChatTemplate::chatml);
//! let messages = [serde_json::json!({"role": "user", "content": "Hi"})];
//! let extra = serde_json::Map::new();
//! let prompt = template.render(&TemplateInput { messages: &messages, tools: None, add_generation_prompt: true, extra: &extra })?;
//! // The template writes BOS itself where the model wants one.
//! let prompt_ids = tok.encode(&prompt, false)?;
//! let mut detok = IncrementalDecoder::new();
//! for id in [9707u32, 0] /* sampled ids */ {
//!     if tok.eos_token_ids().contains(&id) {
//!         break;
//!     }
//!     print!("{}", detok.push(&tok, id));
//! }
//! print!("{}", detok.flush());
//! # let _ = prompt_ids;
//! # Ok(())
//! # }
//! ```

mod detokenize;
mod error;
mod gguf_header;
mod gguf_meta;
mod gguf_vocab;
mod jinja_compat;
mod profile;
mod reasoning;
mod sentencepiece;
mod stop;
mod template;
mod tokenizer;
mod tool_calls;
mod vocab_model;

pub use detokenize::IncrementalDecoder;
pub use error::ChatError;
pub use gguf_header::{read_gguf_keys, read_tokenizer_metadata};
pub use gguf_meta::{GgufMetadata, GgufValue};
pub use profile::{MessageBoundaries, ModelProfile, ReasoningProfile, TemplateCapabilities};
pub use reasoning::{prompt_ends_in_reasoning, ReasoningSplitter, Split};
pub use stop::{StopMatcher, StopStep};
pub use template::{ChatTemplate, TemplateInput, CHAT_TEMPLATE_KEY};
pub use tokenizer::Tokenizer;
pub use tool_calls::{
    parse_message, ParsedCall, ParsedMessage, ToolCallFormat, ToolCallParser, ToolEvent, ToolSchema,
};

#[cfg(test)]
mod tests {
    /// The server shares one tokenizer and template across request threads.
    #[test]
    fn shared_types_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<crate::Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
        assert_send_sync::<crate::IncrementalDecoder>();
        assert_send_sync::<crate::ModelProfile>();
    }
}
