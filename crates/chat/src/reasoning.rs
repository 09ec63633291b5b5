//! Splits generated text into reasoning and content, the way OpenAI-compatible servers fill
//! `reasoning_content` for models that think inside `<think>…</think>` (DeepSeek-R1, Qwen3).
//!
//! The tags are dropped. A tag can arrive split across tokens, so a tail that could still
//! become one is held back. Only a leading opening tag counts: models emit it as their first
//! output, and a later `<think>` (say, in code the model writes) is content. The whitespace the
//! model puts between the closing tag and its answer is dropped.

use crate::stop::partial_match_start;

/// Where the splitter is in the generated text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the opening tag may still come.
    Start,
    /// Inside the reasoning block, looking for the closing tag.
    Reasoning,
    /// Just after the closing tag, dropping whitespace.
    AfterClose,
    /// Everything from here on is content.
    Content,
}

/// Per-request reasoning/content router.
#[derive(Debug)]
pub struct ReasoningSplitter {
    open: String,
    close: String,
    state: State,
    /// Text not yet routed: in `Start`, leading whitespace plus a possible partial opening
    /// tag; in `Reasoning`, a possible partial closing tag; otherwise empty.
    pending: String,
}

/// Text routed by one push.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Split {
    /// Goes to `reasoning_content`.
    pub reasoning: String,
    /// Goes to `content`.
    pub content: String,
}

impl ReasoningSplitter {
    /// A splitter for the `open`/`close` tag pair. `starts_in_reasoning` is for templates that
    /// already put the opening tag in the prompt (see [`prompt_ends_in_reasoning`]).
    ///
    /// # Panics
    /// If either tag is empty.
    pub fn new(open: &str, close: &str, starts_in_reasoning: bool) -> Self {
        assert!(!open.is_empty() && !close.is_empty(), "reasoning tags must not be empty");
        let state = if starts_in_reasoning { State::Reasoning } else { State::Start };
        Self { open: open.into(), close: close.into(), state, pending: String::new() }
    }

    /// Whether text pushed now would be reasoning.
    pub fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    /// Routes newly generated `text`; a possible partial tag is held back for the next push.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        self.pending.push_str(text);
        if self.state == State::Start {
            self.route_start();
        }
        if self.state == State::Reasoning {
            self.route_reasoning(&mut out);
        }
        if self.state == State::AfterClose {
            let rest = self.pending.trim_start();
            if !rest.is_empty() {
                self.pending = rest.to_string();
                self.state = State::Content;
            } else {
                self.pending.clear();
            }
        }
        if self.state == State::Content {
            out.content.push_str(&std::mem::take(&mut self.pending));
        }
        out
    }

    /// Generation ended: releases held-back text where it was heading. A partial opening tag
    /// is content; an unterminated reasoning block, partial closing tag included, is reasoning.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Start => Split { content: rest, ..Split::default() },
            State::Reasoning => Split { reasoning: rest, ..Split::default() },
            State::AfterClose | State::Content => Split::default(),
        }
    }

    /// In `Start`: enters reasoning on a leading opening tag (dropping whitespace before it),
    /// waits while the text could still become one, else switches to content.
    fn route_start(&mut self) {
        let trimmed = self.pending.trim_start();
        if let Some(after) = trimmed.strip_prefix(self.open.as_str()) {
            self.pending = after.to_string();
            self.state = State::Reasoning;
        } else if !self.open.starts_with(trimmed) {
            self.state = State::Content;
        }
        // Otherwise hold: whitespace only, or whitespace then a prefix of the opening tag.
    }

    /// In `Reasoning`: releases text up to the closing tag, or up to a possible partial one.
    fn route_reasoning(&mut self, out: &mut Split) {
        if let Some(at) = self.pending.find(self.close.as_str()) {
            out.reasoning.push_str(&self.pending[..at]);
            self.pending.drain(..at + self.close.len());
            self.state = State::AfterClose;
        } else {
            let hold = partial_match_start(&self.pending, &[&self.close]);
            out.reasoning.extend(self.pending.drain(..hold));
        }
    }
}

/// Whether a rendered prompt leaves the model inside a reasoning block: its last opening tag
/// comes after its last closing tag, as when Qwen3-style templates end the generation prompt
/// with `"<think>\n"`. Then the splitter should start in reasoning.
pub fn prompt_ends_in_reasoning(prompt: &str, open: &str, close: &str) -> bool {
    match (prompt.rfind(open), prompt.rfind(close)) {
        (Some(_), None) => true,
        // `>=` the end of the close tag, so an open tag found inside the close tag doesn't count.
        (Some(o), Some(c)) => o >= c + close.len(),
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stop::all_splits;

    fn think_tags(starts_in_reasoning: bool) -> ReasoningSplitter {
        ReasoningSplitter::new("<think>", "</think>", starts_in_reasoning)
    }

    fn split(reasoning: &str, content: &str) -> Split {
        Split { reasoning: reasoning.into(), content: content.into() }
    }

    /// Feeds `pieces` then finishes; returns everything routed to each side.
    fn run(mut s: ReasoningSplitter, pieces: &[&str]) -> Split {
        let mut steps: Vec<Split> = pieces.iter().map(|p| s.push(p)).collect();
        steps.push(s.finish());
        split(
            &steps.iter().map(|x| x.reasoning.as_str()).collect::<String>(),
            &steps.iter().map(|x| x.content.as_str()).collect::<String>(),
        )
    }

    #[test]
    fn tags_split_across_pushes() {
        let mut s = think_tags(false);
        assert_eq!(s.push("<thi"), split("", ""));
        assert!(!s.in_reasoning());
        assert_eq!(s.push("nk>\nI think"), split("\nI think", ""));
        assert!(s.in_reasoning());
        assert_eq!(s.push("</th"), split("", ""));
        assert!(s.in_reasoning());
        assert_eq!(s.push("ink>\n\n"), split("", ""));
        assert!(!s.in_reasoning());
        assert_eq!(s.push("Paris"), split("", "Paris"));
        assert_eq!(s.finish(), split("", ""));
    }

    #[test]
    fn text_streams_out_as_soon_as_it_cannot_be_a_tag() {
        let mut s = think_tags(false);
        assert_eq!(s.push("Hello"), split("", "Hello"));
        assert_eq!(s.push(" <think>"), split("", " <think>"));
        let mut s = think_tags(false);
        assert_eq!(s.push("<think>a < b"), split("a < b", ""));
        assert_eq!(s.push(" </"), split(" ", ""));
        assert_eq!(s.push("x"), split("</x", ""));
    }

    #[test]
    fn leading_whitespace_waits_for_the_tag() {
        let mut s = think_tags(false);
        assert_eq!(s.push("\n"), split("", ""));
        assert_eq!(s.push(" <th"), split("", ""));
        assert_eq!(s.push("ink>r"), split("r", ""));
        let mut s = think_tags(false);
        assert_eq!(s.push("\n"), split("", ""));
        assert_eq!(s.push("Hi"), split("", "\nHi"));
    }

    #[test]
    fn starting_in_reasoning_ends_at_the_close_tag() {
        let mut s = think_tags(true);
        assert!(s.in_reasoning());
        assert_eq!(s.push("Let me see"), split("Let me see", ""));
        assert_eq!(s.push("</think>\n\n42"), split("", "42"));
        assert!(!s.in_reasoning());
    }

    /// Checks each (starts_in_reasoning, text, reasoning, content) case under every chunking.
    fn check_all_splits(open: &str, close: &str, cases: &[(bool, &str, &str, &str)]) {
        for &(starts, text, reasoning, content) in cases {
            for pieces in all_splits(text) {
                let got = run(ReasoningSplitter::new(open, close, starts), &pieces);
                assert_eq!(got, split(reasoning, content), "starts {starts}, pieces {pieces:?}");
            }
        }
    }

    /// Short tags keep the texts short enough to try every chunking.
    #[test]
    fn result_is_independent_of_how_text_is_chunked() {
        check_all_splits(
            "<t>",
            "</t>",
            &[
                (false, "<t>\nI t</t>\n\nParis", "\nI t", "Paris"),
                (false, "Paris", "", "Paris"),
                (false, " \nParis", "", " \nParis"),
                (false, "\n<t>r</t>c", "r", "c"),
                (false, "Hi <t>x</t>", "", "Hi <t>x</t>"),
                (false, "<t>a</t>b<t>c</t>", "a", "b<t>c</t>"),
                (false, "<t>a</t> b \n c", "a", "b \n c"),
                (false, "<t>a</t>\n \n", "a", ""),
                (false, "<t></t>", "", ""),
                (false, "<t>x</ </</t>ok", "x</ </", "ok"),
                (false, "<t>ü</t>é", "ü", "é"),
                (false, "<t>o <t> a", "o <t> a", ""),
                (false, "<t>u</", "u</", ""),
                (false, "<", "", "<"),
                (false, "<x>", "", "<x>"),
                (false, "\n\n", "", "\n\n"),
                (true, "I t</t>\n\nP", "I t", "P"),
                (true, "<t>n</t>x", "<t>n", "x"),
                (true, "still", "still", ""),
            ],
        );
    }

    #[test]
    fn think_tags_under_every_chunking() {
        check_all_splits(
            "<think>",
            "</think>",
            &[
                (false, "<think>a</think>\nb", "a", "b"),
                (false, "a<think>b</think>", "", "a<think>b</think>"),
                (false, "<think>a</thin", "a</thin", ""),
                (true, "a</think>\n\nb", "a", "b"),
            ],
        );
    }

    #[test]
    #[should_panic(expected = "must not be empty")]
    fn empty_tag_is_refused() {
        ReasoningSplitter::new("<think>", "", false);
    }

    #[test]
    fn prompt_reasoning_state() {
        let ends = |p: &str| prompt_ends_in_reasoning(p, "<think>", "</think>");
        assert!(ends("<|im_start|>assistant\n<think>\n"));
        assert!(!ends("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!ends("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
        assert!(ends("<think>a</think>b<|im_end|>\n<|im_start|>assistant\n<think>\n"));
        assert!(!ends("stray </think> only"));
        // The open tag occurs inside the close tag: the prompt ends after a close.
        assert!(!prompt_ends_in_reasoning("think /think", "think", "/think"));
        assert!(prompt_ends_in_reasoning("/think think", "think", "/think"));
    }
}
