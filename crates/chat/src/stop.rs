//! OpenAI `stop` strings applied to streamed text. A stop string can arrive split across
//! tokens, so the tail of the text that could still grow into one is held back until it either
//! completes (generation stops, the stop string and all after it are dropped) or cannot.
//!
//! When several stop strings occur, the one that starts earliest wins, even if a shorter one
//! inside it completed first: `["abcd", "bc"]` on "xabcd" yields "x". Waiting for the longer
//! one keeps the result the same however the text is cut into tokens.

/// Per-request stop-string state.
#[derive(Debug, Default)]
pub struct StopMatcher {
    /// Non-empty stop strings.
    stops: Vec<String>,
    /// Text received but not yet released: always a (possibly empty) tail that a stop string
    /// could still start in.
    pending: String,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

/// What one [`StopMatcher::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopStep {
    /// Text that may be sent to the client now (possibly empty).
    pub text: String,
    /// A stop string has matched: generation should end and nothing more will be released.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored, so an empty list passes text through.
    pub fn new(stops: &[String]) -> Self {
        let stops = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        Self { stops, ..Self::default() }
    }

    /// Adds newly generated `text`; returns what can be released and whether a stop matched.
    /// After a stop, returns empty text and `stopped` forever.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stopped() {
            return StopStep { text: String::new(), stopped: true };
        }
        self.pending.push_str(text);
        let hold = partial_match_start(&self.pending, &self.stops);
        match self.earliest_stop() {
            // A stop is complete and no stop starting before it can still complete.
            Some((at, stop)) if at <= hold => {
                StopStep { text: self.stop_at(at, stop), stopped: true }
            }
            _ => StopStep { text: self.pending.drain(..hold).collect(), stopped: false },
        }
    }

    /// Generation ended without the matcher stopping it: releases the held-back text, cut at
    /// a stop string if one completed while a longer one was still possible.
    pub fn finish(&mut self) -> String {
        match self.earliest_stop() {
            Some((at, stop)) => self.stop_at(at, stop),
            None => std::mem::take(&mut self.pending),
        }
    }

    /// Whether a stop string has matched (in a push or in [`finish`](Self::finish)); the
    /// caller reports `finish_reason: "stop"` then.
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that matched (Anthropic's `stop_sequence` reports it).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Byte offset in `pending` of the earliest-starting complete stop string, and which one.
    /// Of several starting there the shortest, the one that completes first however the text
    /// is cut into pieces.
    fn earliest_stop(&self) -> Option<(usize, usize)> {
        (0..self.stops.len())
            .filter_map(|i| self.pending.find(self.stops[i].as_str()).map(|at| (at, i)))
            .min_by_key(|&(at, i)| (at, self.stops[i].len()))
    }

    /// Stops at stop string `stop`: returns the pending text before `at` and drops the rest.
    fn stop_at(&mut self, at: usize, stop: usize) -> String {
        self.matched = Some(self.stops[stop].clone());
        self.pending.truncate(at);
        std::mem::take(&mut self.pending)
    }
}

/// Byte offset where the longest suffix of `text` that is a proper prefix of one of `patterns`
/// begins, or `text.len()` if there is none. Only char boundaries are tried, so holding back
/// from here never splits a character.
pub(crate) fn partial_match_start(text: &str, patterns: &[impl AsRef<str>]) -> usize {
    let longest = patterns.iter().map(|p| p.as_ref().len()).max().unwrap_or(0);
    // A proper prefix is shorter than its pattern, so only the last `longest - 1` bytes matter.
    let mut from = text.len().saturating_sub(longest.saturating_sub(1));
    while !text.is_char_boundary(from) {
        from += 1;
    }
    text[from..]
        .char_indices()
        .map(|(i, _)| from + i)
        .find(|&i| {
            let tail = &text[i..];
            patterns.iter().any(|p| p.as_ref().len() > tail.len() && p.as_ref().starts_with(tail))
        })
        .unwrap_or(text.len())
}

/// Every way to cut `text` into non-empty pieces at char boundaries: 2^(chars-1) of them, so
/// test texts stay short.
#[cfg(test)]
pub(crate) fn all_splits(text: &str) -> impl Iterator<Item = Vec<&str>> {
    let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    assert!(cuts.len() <= 20, "{text:?} has too many ways to split");
    (0u64..1 << cuts.len()).map(move |mask| {
        let mut pieces = Vec::new();
        let mut start = 0;
        for (bit, &cut) in cuts.iter().enumerate() {
            if mask & (1 << bit) != 0 {
                pieces.push(&text[start..cut]);
                start = cut;
            }
        }
        pieces.push(&text[start..]);
        pieces
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn step(text: &str, stopped: bool) -> StopStep {
        StopStep { text: text.into(), stopped }
    }

    /// Feeds `pieces`, then finishes; returns all released text and whether it stopped.
    /// Checks that once stopped, every later push is empty and stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = matcher(stops);
        let mut out = String::new();
        let mut stopped = false;
        for piece in pieces {
            let s = m.push(piece);
            assert!(!stopped || s == step("", true), "{pieces:?}: released {s:?} after stopping");
            stopped = s.stopped;
            out.push_str(&s.text);
        }
        let tail = m.finish();
        assert!(!stopped || tail.is_empty(), "{pieces:?}: finish released {tail:?} after stopping");
        out.push_str(&tail);
        (out, m.stopped())
    }

    #[test]
    fn stop_split_across_pushes_is_held_then_dropped() {
        let mut m = matcher(&["llo"]);
        assert_eq!(m.push("he"), step("he", false));
        assert_eq!(m.push("l"), step("", false));
        assert_eq!(m.push("lo world"), step("", true));
        assert_eq!(m.push("more"), step("", true));
        assert_eq!(m.finish(), "");
        assert!(m.stopped());
    }

    #[test]
    fn the_matched_stop_is_the_earliest_then_shortest_however_the_text_is_cut() {
        for (stops, text, expected) in [
            (&["END", "x"][..], "abENDx", Some("END")),
            (&["abc", "ab"][..], "zabcd", Some("ab")),
            (&["q"][..], "ab", None),
        ] {
            for pieces in all_splits(text) {
                let mut m = matcher(stops);
                for piece in &pieces {
                    m.push(piece);
                }
                m.finish();
                assert_eq!(m.matched(), expected, "{stops:?} on {pieces:?}");
            }
        }
    }

    #[test]
    fn held_prefix_is_released_when_it_cannot_complete() {
        let mut m = matcher(&["\n\n"]);
        assert_eq!(m.push("a\n"), step("a", false));
        assert_eq!(m.push("b"), step("\nb", false));
        assert_eq!(m.finish(), "");
        assert!(!m.stopped());
    }

    #[test]
    fn holds_the_longest_suffix_that_could_start_a_stop() {
        let mut m = matcher(&["abab"]);
        assert_eq!(m.push("xaba"), step("x", false));
        assert_eq!(m.push("c"), step("abac", false));
        let mut m = matcher(&["abab"]);
        assert_eq!(m.push("xaba"), step("x", false));
        assert_eq!(m.push("b!"), step("", true));
    }

    #[test]
    fn finish_releases_an_unfinished_stop_prefix() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("the EN"), step("the ", false));
        assert_eq!(m.finish(), "EN");
        assert!(!m.stopped());
    }

    #[test]
    fn no_stops_or_empty_stops_pass_text_through() {
        for stops in [&[][..], &[""][..]] {
            let mut m = matcher(stops);
            assert_eq!(m.push("a"), step("a", false));
            assert_eq!(m.push(""), step("", false));
            assert_eq!(m.push("b\n"), step("b\n", false));
            assert_eq!(m.finish(), "");
        }
    }

    #[test]
    fn empty_stop_is_ignored_next_to_real_ones() {
        let mut m = matcher(&["", "x"]);
        assert_eq!(m.push("abxc"), step("ab", true));
    }

    #[test]
    fn earlier_start_waits_for_longer_stop() {
        let mut m = matcher(&["abcd", "bc"]);
        // "bc" is complete, but "abcd" starts earlier and may still complete.
        assert_eq!(m.push("xabc"), step("x", false));
        assert_eq!(m.push("d"), step("", true));
        let mut m = matcher(&["abcd", "bc"]);
        assert_eq!(m.push("xabc"), step("x", false));
        assert_eq!(m.push("e"), step("a", true));
    }

    #[test]
    fn never_holds_half_a_character() {
        // "ã" and "é" share their first UTF-8 byte; a byte-wise hold would split "ã".
        let mut m = matcher(&["é"]);
        assert_eq!(m.push("ã"), step("ã", false));
        assert_eq!(m.push("ãé"), step("ã", true));
    }

    #[test]
    fn result_is_independent_of_how_text_is_chunked() {
        // (stops, generated text, released text, stopped)
        let cases: &[(&[&str], &str, &str, bool)] = &[
            (&["llo"], "hello world", "he", true),
            (&["\n\n"], "a\nb\n\nc", "a\nb", true),
            (&["\n\n"], "a\nb\nc\n", "a\nb\nc\n", false),
            (&["END"], "partial EN", "partial EN", false),
            (&["<|im_end|>"], "<|im_end|>tail", "", true),
            (&["aab"], "aaab", "a", true),
            (&["abab"], "abaabab", "aba", true),
            (&["ab", "b"], "xab", "x", true),
            (&["b", "ab"], "xab", "x", true),
            (&["abcd", "bc"], "xabcd", "x", true),
            (&["abcd", "bc"], "xabce", "xa", true),
            (&["abcd", "bc"], "xabc", "xa", true),
            (&["bc", "bcd"], "abcd", "a", true),
            (&["é!"], "caféé!x", "café", true),
            (&["世界"], "你好世界!", "你好", true),
            (&["é"], "ãaã", "ãaã", false),
            (&[], "plain text", "plain text", false),
        ];
        for &(stops, text, want, want_stopped) in cases {
            for pieces in all_splits(text) {
                let got = run(stops, &pieces);
                assert_eq!(
                    got,
                    (want.to_string(), want_stopped),
                    "stops {stops:?}, pieces {pieces:?}"
                );
            }
        }
    }

    #[test]
    fn empty_pushes_between_pieces_change_nothing() {
        for pieces in all_splits("say llama") {
            let padded: Vec<&str> = pieces.iter().flat_map(|p| ["", *p, ""]).collect();
            assert_eq!(run(&["lla"], &padded), ("say ".to_string(), true), "{padded:?}");
        }
    }

    #[test]
    fn all_splits_covers_every_cut() {
        let splits: Vec<Vec<&str>> = all_splits("aéc").collect();
        assert_eq!(splits, [vec!["aéc"], vec!["a", "éc"], vec!["aé", "c"], vec!["a", "é", "c"]]);
        assert_eq!(all_splits("x").collect::<Vec<_>>(), [vec!["x"]]);
    }
}
