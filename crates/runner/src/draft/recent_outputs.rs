//! Drafts from other requests: the outputs the engine finished lately, each with the last
//! tokens of the prompt that led into it. Agents repeat themselves across calls (the same
//! tool call with one argument changed, a file written again after an edit, a retry after a
//! client time-out) and vLLM's suffix decoding drafts from past outputs for that reason. A
//! draft is only a guess the model verifies, so what other requests wrote never reaches an
//! answer unless the model would have written it anyway.

use std::collections::VecDeque;

use super::token_index::{TokenIndex, LONGEST_MATCH};

/// Tokens kept over all outputs; the oldest outputs go first.
const CAPACITY_TOKENS: usize = 64 * 1024;

/// The engine's recent outputs, newest last.
#[derive(Default)]
pub struct RecentOutputs {
    outputs: VecDeque<TokenIndex>,
    tokens: usize,
}

impl RecentOutputs {
    /// Keeps `output` (with the end of `prompt`, so the output's first tokens can be found
    /// from how a prompt ends); an empty output is not kept.
    pub fn add(&mut self, prompt: &[u32], output: &[u32]) {
        if output.is_empty() {
            return;
        }
        let lead = &prompt[prompt.len().saturating_sub(LONGEST_MATCH)..];
        let kept = &output[output.len().saturating_sub(CAPACITY_TOKENS - lead.len())..];
        let mut index = TokenIndex::with_capacity(lead.len() + kept.len());
        for &token in lead.iter().chain(kept) {
            index.push(token);
        }
        self.tokens += index.tokens().len();
        self.outputs.push_back(index);
        while self.tokens > CAPACITY_TOKENS {
            let oldest = self.outputs.pop_front().expect("tokens are counted in outputs");
            self.tokens -= oldest.tokens().len();
        }
    }

    /// Up to `want` tokens that followed `tail` in the newest output where it occurs.
    pub fn follow(&self, tail: &[u32], want: usize) -> Option<&[u32]> {
        self.outputs.iter().rev().find_map(|output| output.follow(tail, want))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_is_found_from_the_prompt_end_that_led_into_it() {
        let mut recent = RecentOutputs::default();
        recent.add(&[9, 9, 7, 8], &[1, 2, 3, 4]);
        // A new prompt that ends as that one did gets the output as its draft.
        assert_eq!(recent.follow(&[7, 8], 8), Some(&[1, 2, 3, 4][..]));
        assert_eq!(recent.follow(&[2, 3], 1), Some(&[4][..]));
        recent.add(&[5], &[2, 3, 6]);
        assert_eq!(recent.follow(&[2, 3], 1), Some(&[6][..]), "the newest output first");
        recent.add(&[5], &[]);
        assert_eq!(recent.outputs.len(), 2, "an empty output is not kept");
    }

    #[test]
    fn the_oldest_outputs_go_when_the_pool_is_full() {
        let mut recent = RecentOutputs::default();
        recent.add(&[], &[1, 2, 3]);
        let long: Vec<u32> = (100..100 + CAPACITY_TOKENS as u32 - 2).collect();
        recent.add(&[], &long);
        assert!(recent.tokens <= CAPACITY_TOKENS);
        assert_eq!(recent.follow(&[1, 2], 1), None, "the first output went");
        assert_eq!(recent.follow(&[100, 101], 1), Some(&[102][..]));
        // One output longer than the pool keeps its end.
        recent.add(&[], &(0..CAPACITY_TOKENS as u32 + 10).collect::<Vec<_>>());
        assert_eq!(recent.outputs.len(), 1);
        assert!(recent.tokens <= CAPACITY_TOKENS);
    }
}
