//! One compiled grammar per request, a mask per step: the tokens the grammar forbids next get
//! a logit of −∞ before sampling, so what is sampled always stays inside the grammar.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory};
use spindle_chat::Tokenizer;

use crate::error::ConstrainError;
use crate::vocabulary::Vocabulary;

/// Compiles grammars for one tokenizer (built once per model: the trie and llguidance's token
/// slices take a moment for a 150k vocabulary).
pub struct Grammars {
    factory: ParserFactory,
    stop_ids: Arc<[u32]>,
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, ConstrainError> {
        let env: TokEnv = Arc::new(Vocabulary::new(tokenizer));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstrainError::Vocabulary(e.to_string()))?;
        // llguidance logs grammar warnings to stderr by default; errors reach us as results.
        factory.quiet();
        Ok(Self { factory, stop_ids: tokenizer.eos_token_ids().into() })
    }

    /// A matcher for `grammar`, or why the grammar can't be enforced.
    pub fn compile(&self, grammar: TopLevelGrammar) -> Result<Constraint, ConstrainError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstrainError::Unsupported(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(ConstrainError::Unsupported(error));
        }
        let vocab_size = self.factory.tok_env().tok_trie().vocab_size();
        let eos = self.factory.tok_env().tok_trie().eos_token();
        Ok(Constraint { matcher, stop_ids: self.stop_ids.clone(), vocab_size, eos })
    }
}

/// A request's grammar state: which tokens may come next.
pub struct Constraint {
    matcher: Matcher,
    stop_ids: Arc<[u32]>,
    vocab_size: usize,
    /// The id llguidance allows where the grammar may end; any stop id then is allowed.
    eos: u32,
}

impl Constraint {
    /// Sets the logits of the tokens the grammar forbids next to −∞ (ids beyond the
    /// tokenizer's vocabulary included: model rows without a token).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstrainError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstrainError::Failed(e.to_string()))?;
        let may_end = allowed.is_allowed(self.eos);
        for (id, logit) in logits.iter_mut().enumerate() {
            let id = id as u32;
            let ok = (id as usize) < self.vocab_size && allowed.is_allowed(id)
                || may_end && self.stop_ids.contains(&id);
            if !ok {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Moves the grammar past `token`. A stop id ends generation, so it moves nothing.
    pub fn advance(&mut self, token: u32) -> Result<(), ConstrainError> {
        if self.stop_ids.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| ConstrainError::Failed(e.to_string()))
    }

    /// Back to the grammar's start, for a sequence that is run again from its prompt.
    pub fn reset(&mut self) -> Result<(), ConstrainError> {
        self.matcher.reset().map_err(|e| ConstrainError::Failed(e.to_string()))
    }

    /// The grammar is complete and allows nothing more than the end.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}
