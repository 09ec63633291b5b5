//! Where each short run of a token stream last occurred: the index both drafters look their
//! sequence's latest tokens up in (the sequence's own tokens, and other requests' recent
//! outputs).

use std::collections::HashMap;

/// The longest and shortest runs of recent tokens looked up, longest first: a longer match
/// predicts better, a shorter one finds more.
pub(super) const LONGEST_MATCH: usize = 4;
pub(super) const SHORTEST_MATCH: usize = 2;

/// A run of up to [`LONGEST_MATCH`] tokens as a fixed-size key (each run length has a map of its
/// own, so the padding never makes two runs equal): indexing an 18K-token prompt allocates
/// nothing per token.
type Run = [u32; LONGEST_MATCH];

fn run_key(tokens: &[u32]) -> Run {
    let mut key = [u32::MAX; LONGEST_MATCH];
    key[..tokens.len()].copy_from_slice(tokens);
    key
}

/// A token stream and, per run length, the position after each run's latest occurrence.
#[derive(Default)]
pub(super) struct TokenIndex {
    tokens: Vec<u32>,
    /// Per run length `n` (index `n - SHORTEST_MATCH`): for each run of `n` tokens, the index
    /// of the token that followed its latest occurrence.
    followers: [HashMap<Run, usize>; LONGEST_MATCH - SHORTEST_MATCH + 1],
}

impl TokenIndex {
    pub fn with_capacity(tokens: usize) -> Self {
        Self { tokens: Vec::with_capacity(tokens), ..Self::default() }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends `token` (each run it ends now has a known follower).
    pub fn push(&mut self, token: u32) {
        let end = self.tokens.len();
        for n in SHORTEST_MATCH..=LONGEST_MATCH.min(end) {
            let run = run_key(&self.tokens[end - n..]);
            self.followers[n - SHORTEST_MATCH].insert(run, end);
        }
        self.tokens.push(token);
    }

    /// Up to `want` tokens that followed the latest occurrence of `tail` (2 to 4 tokens),
    /// ending before the stream's own end; `None` when `tail` never occurred.
    pub fn follow(&self, tail: &[u32], want: usize) -> Option<&[u32]> {
        debug_assert!((SHORTEST_MATCH..=LONGEST_MATCH).contains(&tail.len()));
        let from = *self.followers[tail.len() - SHORTEST_MATCH].get(&run_key(tail))?;
        let end = self.tokens.len().min(from + want);
        (from < end).then(|| &self.tokens[from..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_leads_to_what_followed_its_latest_occurrence() {
        let mut index = TokenIndex::default();
        for t in [1, 2, 3, 4, 5, 1, 2, 6] {
            index.push(t);
        }
        assert_eq!(index.follow(&[1, 2], 3), Some(&[6][..]), "the latest occurrence");
        assert_eq!(index.follow(&[2, 3, 4], 8), Some(&[5, 1, 2, 6][..]));
        assert_eq!(index.follow(&[7, 8], 3), None);
        // A run at the very end has no follower yet.
        assert_eq!(index.follow(&[2, 6], 3), None);
    }
}
