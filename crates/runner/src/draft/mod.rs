//! Drafts for speculative decoding, taken from the sequence's own tokens and then from other
//! requests' recent outputs: where its last few tokens occurred before (in the prompt, in what
//! it wrote, in what another request wrote), the tokens that followed then are proposed to
//! follow now (prompt-lookup / n-gram drafting). Agents copy paths,
//! identifiers and whole blocks out of their context, so such drafts are often right; where
//! nothing matches, nothing is drafted and the step is a plain decode step.
//!
//! Where the lookup finds nothing, a draft model of the target's vocabulary (`--draft-model`,
//! [`DraftPool`]) proposes instead: the lookup's drafts cost nothing to make and are right
//! more often when they exist (copied text), the draft model's cost a few of its steps.
//!
//! How many tokens to draft follows how many were accepted lately: the length grows after a
//! round that accepted everything and shrinks after one that accepted little, and a sequence
//! whose drafts keep failing stops drafting for a while, longer each time it fails again (a
//! rejected draft costs a row of the step for nothing). Where a row costs more, more must be
//! accepted to go on ([`break_even`]).

mod draft_model;
mod model_drafts;
mod recent_outputs;
mod rollback_memory;
mod token_index;

use std::sync::Arc;

use spindle_models::CausalLm;

pub use draft_model::DraftModel;
pub use model_drafts::{DraftPool, DraftRound, ModelDraft};
pub use recent_outputs::RecentOutputs;
pub use rollback_memory::{share_rollback_memory, RollbackHold, RollbackShare, RollbackStates};
use token_index::{TokenIndex, LONGEST_MATCH, SHORTEST_MATCH};

/// The draft length a sequence starts with.
const FIRST_LENGTH: usize = 4;
/// Below this share of drafted tokens accepted (over recent rounds), drafting pauses: on an
/// attention-only model a verified row costs little beside the step's one (the weights are
/// read once for all rows).
const BREAK_EVEN: f32 = 0.25;
/// The same on a model with recurrent layers. Its verification runs those layers token by token
/// and keeps a whole state per row, and its experts are read per row (each picks its own);
/// measured on the random Qwen3.5-MoE shapes (2-core AVX2 EPYC), a verified row costs ~0.6
/// (agent-bench shape) to ~0.8 (35B-A3B layers) of a plain step, so a round gains only where
/// at least that share of its drafts is accepted.
const RECURRENT_BREAK_EVEN: f32 = 0.75;
/// Tokens decoded plainly before a paused sequence drafts again, the first time.
const PAUSE_TOKENS: usize = 32;
/// Pauses in a row double up to this many times (32 → 512 tokens), so a text that keeps
/// offering wrong drafts costs a failed round ever more rarely.
const LONGEST_PAUSE_DOUBLINGS: u32 = 4;
/// Weight of the latest round in the running acceptance.
const RECENT_WEIGHT: f32 = 0.3;

/// A stand-in for the lookup, for tests: given the sequence's tokens so far (prompt and
/// decided tokens) and the room, the drafts to propose, e.g. the right ones with a wrong token
/// where the test wants the model to reject one.
#[derive(Clone)]
pub struct DraftScript(pub Arc<ProposeFn>);

/// Proposes drafts from the tokens so far and the room for them.
pub type ProposeFn = dyn Fn(&[u32], usize) -> Vec<u32> + Send + Sync;

impl std::fmt::Debug for DraftScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DraftScript")
    }
}

/// What a sequence drafts in a round.
#[derive(Debug, PartialEq, Eq)]
pub enum Proposal {
    /// These tokens (the lookup's, or a script's); none while drafting pauses.
    Tokens(Vec<u32>),
    /// The lookup found nothing: up to this many from the draft model, if there is one.
    Fallback(usize),
}

/// One sequence's drafter: its tokens so far and where each short run of them last occurred.
pub struct NgramDrafter {
    history: TokenIndex,
    /// Most tokens to draft per round (the server's limit).
    max_length: usize,
    /// Tokens to draft next round.
    length: usize,
    /// Share of drafted tokens accepted, weighted toward recent rounds; it starts at the
    /// break-even, so a first round that accepts less pauses at once and a good one goes on.
    acceptance: f32,
    /// Plain decode steps left before drafting again.
    paused: usize,
    /// Pauses since a round last accepted every draft.
    pauses_in_a_row: u32,
    /// Acceptance below which drafting pauses.
    break_even: f32,
    /// Proposes instead of the lookup (tests).
    script: Option<DraftScript>,
    /// Whether the lookup drafts at all (off, only the fallback does).
    lookup: bool,
}

impl NgramDrafter {
    /// A drafter over `prompt`, proposing at most `max_length` tokens a round (by `script`
    /// instead of the lookup, if given; by the fallback alone unless `lookup`).
    pub fn new(
        prompt: &[u32],
        max_length: usize,
        script: Option<DraftScript>,
        lookup: bool,
    ) -> Self {
        let mut drafter = Self {
            history: TokenIndex::with_capacity(prompt.len() + 256),
            max_length,
            length: FIRST_LENGTH.min(max_length),
            acceptance: BREAK_EVEN,
            paused: 0,
            pauses_in_a_row: 0,
            break_even: BREAK_EVEN,
            script,
            lookup,
        };
        for &token in prompt {
            drafter.push(token);
        }
        drafter
    }

    /// The same, pausing below `break_even` ([`break_even`]) instead of the attention-only one.
    pub fn with_break_even(self, break_even: f32) -> Self {
        Self { break_even, acceptance: break_even, ..self }
    }

    /// Records the sequence's next token.
    pub fn push(&mut self, token: u32) {
        self.history.push(token);
    }

    /// The sequence's prompt and decided tokens.
    pub fn history(&self) -> &[u32] {
        self.history.tokens()
    }

    /// Up to `room` tokens to follow the history, from the latest earlier occurrence of its
    /// longest matching tail, in its own tokens first and then in `recent` outputs of other
    /// requests; where nothing matches, the length to draft by other means.
    pub fn propose(&mut self, room: usize, recent: &RecentOutputs) -> Proposal {
        let history = self.history.tokens();
        if let Some(script) = &self.script {
            let mut drafts = (script.0)(history, room);
            drafts.truncate(room.min(self.max_length));
            return Proposal::Tokens(drafts);
        }
        if self.paused > 0 {
            self.paused -= 1;
            return Proposal::Tokens(Vec::new());
        }
        let want = self.length.min(room);
        let end = history.len();
        if want == 0 {
            return Proposal::Tokens(Vec::new());
        }
        let longest = if self.lookup { LONGEST_MATCH.min(end) } else { 0 };
        for n in (SHORTEST_MATCH..=longest).rev() {
            let tail = &history[end - n..];
            if let Some(drafts) =
                self.history.follow(tail, want).or_else(|| recent.follow(tail, want))
            {
                return Proposal::Tokens(drafts.to_vec());
            }
        }
        Proposal::Fallback(want)
    }

    /// Learns from a round: `accepted` of `drafted` tokens were what the model picked.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let share = accepted as f32 / drafted as f32;
        self.acceptance += RECENT_WEIGHT * (share - self.acceptance);
        self.length = if accepted == drafted {
            self.pauses_in_a_row = 0;
            (self.length * 2).min(self.max_length)
        } else {
            (accepted + 1).clamp(1, self.max_length)
        };
        if self.acceptance < self.break_even {
            self.paused = PAUSE_TOKENS << self.pauses_in_a_row;
            self.pauses_in_a_row = (self.pauses_in_a_row + 1).min(LONGEST_PAUSE_DOUBLINGS);
            // Drafting resumes with a probe: one token, and an acceptance at the break-even,
            // so that one more failing round pauses again (for longer) and a good one grows.
            self.acceptance = self.break_even;
            self.length = 1;
        }
    }
}

/// The acceptance below which `model`'s sequences pause drafting.
pub fn break_even(model: &dyn CausalLm) -> f32 {
    if model.initial_recurrent_state().is_empty() {
        BREAK_EVEN
    } else {
        RECURRENT_BREAK_EVEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup_only(prompt: &[u32]) -> NgramDrafter {
        NgramDrafter::new(prompt, 8, None, true)
    }

    fn propose(drafter: &mut NgramDrafter, room: usize, recent: &RecentOutputs) -> Vec<u32> {
        match drafter.propose(room, recent) {
            Proposal::Tokens(drafts) => drafts,
            Proposal::Fallback(_) => Vec::new(),
        }
    }

    #[test]
    fn the_tokens_after_the_latest_match_are_proposed() {
        let none = RecentOutputs::default();
        // "a b c d e" then "x a b c": the tail "a b c" occurred before, followed by "d e".
        let mut drafter = lookup_only(&[1, 2, 3, 4, 5, 9, 1, 2, 3]);
        assert_eq!(propose(&mut drafter, 8, &none), [4, 5, 9, 1]);
        assert_eq!(propose(&mut drafter, 2, &none), [4, 5], "no more than there is room for");
        // A later occurrence of the tail wins.
        for t in [6, 7, 1, 2, 3] {
            drafter.push(t);
        }
        assert_eq!(propose(&mut drafter, 8, &none), [6, 7, 1, 2]);
    }

    #[test]
    fn a_shorter_tail_matches_when_no_longer_one_does() {
        let none = RecentOutputs::default();
        let mut drafter = lookup_only(&[5, 6, 7, 8, 1, 6, 7]);
        assert_eq!(propose(&mut drafter, 8, &none), [8, 1, 6, 7]);
        let mut nothing = lookup_only(&[1, 2, 3, 4]);
        assert!(propose(&mut nothing, 8, &none).is_empty());
    }

    #[test]
    fn length_follows_acceptance_and_failing_drafts_pause() {
        let none = RecentOutputs::default();
        let prompt: Vec<u32> = (0..40).map(|i| i % 10).collect();
        let mut drafter = lookup_only(&prompt);
        assert_eq!(propose(&mut drafter, 16, &none).len(), 4);
        drafter.record(4, 4);
        assert_eq!(propose(&mut drafter, 16, &none).len(), 8);
        drafter.record(8, 2);
        assert_eq!(propose(&mut drafter, 16, &none).len(), 3);
        drafter.record(3, 0);
        assert_eq!(propose(&mut drafter, 16, &none).len(), 1, "not paused yet");
        drafter.record(1, 0);
        assert!((0..PAUSE_TOKENS).all(|_| propose(&mut drafter, 16, &none).is_empty()), "paused");
        assert_eq!(propose(&mut drafter, 16, &none).len(), 1, "a probe after the pause");
        // One more failing round pauses twice as long.
        drafter.record(1, 0);
        let paused = (0..).take_while(|_| propose(&mut drafter, 16, &none).is_empty()).count();
        assert_eq!(paused, 2 * PAUSE_TOKENS);
        // A probe that succeeds grows the length, and a fully accepted round ends the doubling.
        drafter.record(1, 1);
        assert_eq!(propose(&mut drafter, 16, &none).len(), 2);
        drafter.record(2, 0);
        drafter.record(1, 0);
        let paused = (0..).take_while(|_| propose(&mut drafter, 16, &none).is_empty()).count();
        assert_eq!(paused, PAUSE_TOKENS);
    }

    #[test]
    fn a_first_round_that_fails_pauses_at_once() {
        let none = RecentOutputs::default();
        let prompt: Vec<u32> = (0..40).map(|i| i % 10).collect();
        let mut drafter = lookup_only(&prompt);
        drafter.record(4, 0);
        assert!(propose(&mut drafter, 16, &none).is_empty());
        let mut good = lookup_only(&prompt);
        good.record(4, 1);
        assert_eq!(propose(&mut good, 16, &none).len(), 2, "a quarter accepted goes on");
    }

    #[test]
    fn a_higher_break_even_pauses_sooner() {
        let none = RecentOutputs::default();
        let prompt: Vec<u32> = (0..40).map(|i| i % 10).collect();
        let mut cheap = lookup_only(&prompt);
        let mut costly = lookup_only(&prompt).with_break_even(RECURRENT_BREAK_EVEN);
        for drafter in [&mut cheap, &mut costly] {
            drafter.record(4, 2);
            drafter.record(4, 2);
        }
        assert_eq!(propose(&mut cheap, 16, &none).len(), 3, "half accepted goes on");
        assert!(propose(&mut costly, 16, &none).is_empty(), "half accepted is a loss: paused");
    }

    #[test]
    fn other_requests_outputs_draft_where_the_sequence_s_own_tokens_do_not() {
        let mut recent = RecentOutputs::default();
        recent.add(&[7, 8], &[1, 2, 3, 4, 5]);
        // Nothing in the sequence's own tokens follows "7 8": the earlier output does.
        let mut drafter = lookup_only(&[6, 7, 8]);
        assert_eq!(propose(&mut drafter, 8, &recent), [1, 2, 3, 4]);
        // At the same match length the sequence's own tokens come first...
        let mut own = lookup_only(&[2, 3, 9, 9, 2, 3]);
        assert_eq!(propose(&mut own, 8, &recent), [9, 9, 2, 3]);
        // ...and a longer match in another output beats a shorter one of its own.
        let mut longer = lookup_only(&[3, 9, 1, 2, 3]);
        assert_eq!(propose(&mut longer, 8, &recent), [4, 5]);
    }

    #[test]
    fn the_fallback_drafts_only_where_the_lookup_finds_nothing() {
        let none = RecentOutputs::default();
        let mut matching = lookup_only(&[1, 2, 3, 1, 2]);
        assert_eq!(matching.propose(8, &none), Proposal::Tokens(vec![3, 1, 2]));
        let mut nothing = lookup_only(&[1, 2, 3, 4]);
        assert_eq!(nothing.propose(8, &none), Proposal::Fallback(4), "the length wanted");
        assert_eq!(nothing.propose(2, &none), Proposal::Fallback(2), "within the room");
        let mut model_only = NgramDrafter::new(&[1, 2, 3, 1, 2], 8, None, false);
        assert_eq!(model_only.propose(8, &none), Proposal::Fallback(4), "the lookup off");
    }
}
