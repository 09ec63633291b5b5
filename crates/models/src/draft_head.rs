//! A head that drafts tokens from the target model's own hidden states (the multi-token-prediction
//! head some checkpoints carry), for speculative decoding: its drafts are only proposals, which the
//! target then verifies, so they change the speed of decoding, never its output.

use crate::cache::SequenceCache;
use crate::error::{ModelError, Result};

/// Per row of a [`DraftHead::predict`] pass: the logits for the token after the next, and the
/// head's own final hidden state (fed back as the hidden state to draft one more).
pub struct HeadRows {
    pub logits: Vec<Vec<f32>>,
    pub hidden: Vec<Vec<f32>>,
}

pub trait DraftHead: Send + Sync {
    /// An empty cache for the head's own attention, for at most `context` positions.
    fn new_cache(&self, context: usize) -> SequenceCache;

    /// Runs one row per token, at the positions after those `cache` holds: row `i` pairs the
    /// hidden state `hidden[i]` (rows of the model's hidden width, as
    /// [`SequenceCache::hidden_states`] keeps them) at its position with `tokens[i]`, the token at
    /// the position after it.
    fn predict(
        &self,
        hidden: &[f32],
        tokens: &[u32],
        cache: &mut SequenceCache,
    ) -> Result<HeadRows>;
}

/// Refuses a [`DraftHead::predict`] call whose `hidden` is not one row of `width` per token
/// (or that has no token).
pub fn check_head_rows(hidden: &[f32], tokens: &[u32], width: usize) -> Result<()> {
    if tokens.is_empty() || hidden.len() != tokens.len() * width {
        return Err(ModelError::BadConfig(format!(
            "{} hidden values for {} tokens of width {width}",
            hidden.len(),
            tokens.len()
        )));
    }
    Ok(())
}
