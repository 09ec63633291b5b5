//! Constrained decoding with llguidance. A grammar is built per request (a JSON schema from
//! `response_format`, or the tool-call syntax of the model's format with each tool's
//! parameter schema) and compiled against the model's vocabulary; the engine then asks the
//! request's [`Constraint`] for a mask before sampling each token and advances it after.

mod constraint;
mod error;
pub mod grammar;
mod vocabulary;

pub use constraint::{Constraint, Grammars};
pub use error::ConstrainError;
pub use grammar::{CallMode, ToolRule};
pub use llguidance::api::TopLevelGrammar;
