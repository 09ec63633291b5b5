//! One generation to run, as every caller (the server, `spindle generate`, the benches) plans
//! it for the engine.

use spindle_constrain::Constraint;

use crate::output::ReasoningMode;
use crate::sampler::SamplingParams;

/// Reasoning tokens get their own budget; the engine closes the block itself when it is spent.
#[derive(Clone, Debug)]
pub struct ReasoningBudget {
    /// Reasoning tokens allowed (`None`: only the room rule below applies).
    pub max_tokens: Option<usize>,
    /// Tokens forced to close the block, e.g. those of "\n</think>\n\n".
    pub close_ids: Vec<u32>,
}

/// One generation to run: what the server, `spindle generate` and the benches all plan.
pub struct SequenceRequest {
    pub prompt_ids: Vec<u32>,
    /// Prompt positions after which the prefix cache should keep a snapshot (ends of chat
    /// messages); the end of the prompt is always one.
    pub snapshot_positions: Vec<usize>,
    /// Tokens to generate at most; the caller has already fitted it into the context.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (not emitted).
    pub stop_ids: Vec<u32>,
    /// Strings that end generation (never emitted).
    pub stop_strings: Vec<String>,
    pub reasoning: ReasoningMode,
    pub reasoning_budget: Option<ReasoningBudget>,
    /// Positions the sequence may use in all.
    pub context: usize,
    /// The grammar the answer must follow (after any reasoning), if any.
    pub constraint: Option<Constraint>,
    /// Whether to decode speculatively (the output is the same either way); `None` follows
    /// the engine's [`crate::SpeculationConfig::by_default`].
    pub speculative: Option<bool>,
}

impl SequenceRequest {
    /// Plain generation: no snapshots, stops, reasoning split or grammar.
    pub fn plain(
        prompt_ids: Vec<u32>,
        max_tokens: usize,
        sampling: SamplingParams,
        context: usize,
    ) -> Self {
        Self {
            prompt_ids,
            snapshot_positions: Vec::new(),
            max_tokens,
            sampling,
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            reasoning: ReasoningMode::Off,
            reasoning_budget: None,
            context,
            constraint: None,
            speculative: None,
        }
    }
}
