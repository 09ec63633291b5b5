//! How many tokens a call drafted and how many of them the model kept, from whichever of two
//! sources the server has:
//!
//! - Spindle (and vLLM) count them in `/metrics` as `vllm:spec_decode_num_drafts_total`,
//!   `..._num_draft_tokens_total` and `..._num_accepted_tokens_total`: the difference of a
//!   reading before and after a call is the call's, as long as nothing else runs meanwhile (the
//!   panel sends one call at a time).
//! - llama-server puts them in the `timings` object of its last streamed chunk (`draft_n`,
//!   `draft_n_accepted`; llama.cpp b11434 `server_slot_stats::to_json`), and leaves both out
//!   when nothing was drafted.

use serde_json::Value;

const DRAFTS: &str = "vllm:spec_decode_num_drafts_total";
const DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens_total";
const ACCEPTED: &str = "vllm:spec_decode_num_accepted_tokens_total";

/// Where a call's acceptance figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Metrics,
    Timings,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Metrics => "metrics",
            Source::Timings => "timings",
        }
    }
}

/// Drafting of one call (or the sum of several).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Acceptance {
    /// Speculative rounds that drafted; `None` where the source does not count them
    /// (llama-server's timings).
    pub rounds: Option<u64>,
    pub drafted: u64,
    pub accepted: u64,
}

impl Acceptance {
    /// Accepted over drafted; `None` when nothing was drafted.
    pub fn rate(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }
}

impl std::ops::Add for Acceptance {
    type Output = Acceptance;

    /// The sum of two calls' figures (rounds only when both counted them).
    fn add(self, other: Acceptance) -> Acceptance {
        Acceptance {
            rounds: self.rounds.zip(other.rounds).map(|(a, b)| a + b),
            drafted: self.drafted + other.drafted,
            accepted: self.accepted + other.accepted,
        }
    }
}

/// One reading of the three counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
}

impl Counters {
    /// The counters in a Prometheus text exposition, each summed over its label sets (one per
    /// served model); `None` unless all three are there.
    pub fn parse(text: &str) -> Option<Counters> {
        Some(Counters {
            drafts: counter_sum(text, DRAFTS)?,
            draft_tokens: counter_sum(text, DRAFT_TOKENS)?,
            accepted: counter_sum(text, ACCEPTED)?,
        })
    }

    /// What was counted between `self` and the `later` reading (0 for a counter that went back,
    /// as after a restart).
    pub fn since(&self, later: &Counters) -> Acceptance {
        Acceptance {
            rounds: Some(later.drafts.saturating_sub(self.drafts)),
            drafted: later.draft_tokens.saturating_sub(self.draft_tokens),
            accepted: later.accepted.saturating_sub(self.accepted),
        }
    }
}

/// The sum of every sample named exactly `name` (any labels; `name_more` is another metric);
/// `None` when there is none.
fn counter_sum(text: &str, name: &str) -> Option<u64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let value = match rest.chars().next() {
            Some(' ') => rest,
            Some('{') => match rest.find('}') {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            _ => continue,
        };
        // Counters print as integers or floats (`12`, `1.2e1`); a sample is rounded down.
        if let Some(v) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0) += v.max(0.0) as u64;
        }
    }
    found
}

/// llama-server's figures from the `timings` object of a response; `None` without one. A
/// `timings` without `draft_n` drafted nothing.
pub fn from_timings(timings: &Value) -> Option<Acceptance> {
    let timings = timings.as_object()?;
    let count = |key: &str| timings.get(key).and_then(Value::as_u64).unwrap_or(0);
    Some(Acceptance {
        rounds: None,
        drafted: count("draft_n"),
        accepted: count("draft_n_accepted"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BEFORE: &str =
        "# HELP vllm:spec_decode_num_drafts Speculative rounds that drafted tokens\n\
        # TYPE vllm:spec_decode_num_drafts counter\n\
        vllm:spec_decode_num_drafts_total{model_name=\"a\"} 10\n\
        vllm:spec_decode_num_drafts_total{model_name=\"b\"} 2\n\
        vllm:spec_decode_num_draft_tokens_total{model_name=\"a\"} 80\n\
        vllm:spec_decode_num_accepted_tokens_total{model_name=\"a\"} 50\n\
        vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"a\",position=\"0\"} 9\n";

    #[test]
    fn metric_deltas_sum_label_sets_and_skip_longer_names() {
        let before = Counters::parse(BEFORE).unwrap();
        assert_eq!(before, Counters { drafts: 12, draft_tokens: 80, accepted: 50 });
        let after = Counters::parse(
            "vllm:spec_decode_num_drafts_total{model_name=\"a\"} 40\n\
             vllm:spec_decode_num_drafts_total{model_name=\"b\"} 2\n\
             vllm:spec_decode_num_draft_tokens_total{model_name=\"a\"} 3.2e2\n\
             vllm:spec_decode_num_accepted_tokens_total 230\n",
        )
        .unwrap();
        let delta = before.since(&after);
        assert_eq!(delta, Acceptance { rounds: Some(30), drafted: 240, accepted: 180 });
        assert_eq!(delta.rate(), Some(0.75));
        // A restart sets counters back: nothing negative.
        assert_eq!(after.since(&before), Acceptance { rounds: Some(0), drafted: 0, accepted: 0 });
    }

    #[test]
    fn metrics_without_every_counter_are_no_reading() {
        assert_eq!(Counters::parse(""), None);
        assert_eq!(Counters::parse("vllm:spec_decode_num_drafts_total 3\n"), None);
        let per_pos_only = "vllm:spec_decode_num_accepted_tokens_per_pos_total 3\n\
            vllm:spec_decode_num_drafts_total 1\nvllm:spec_decode_num_draft_tokens_total 1\n";
        assert_eq!(Counters::parse(per_pos_only), None, "the per-position counter is not it");
        assert_eq!(counter_sum("# vllm:spec_decode_num_drafts_total 3\n", DRAFTS), None);
    }

    #[test]
    fn llama_server_timings() {
        let t = json!({"cache_n": 0, "prompt_n": 812, "predicted_n": 400, "predicted_ms": 9000.0,
            "draft_n": 320, "draft_n_accepted": 256});
        let a = from_timings(&t).unwrap();
        assert_eq!(a, Acceptance { rounds: None, drafted: 320, accepted: 256 });
        assert_eq!(a.rate(), Some(0.8));
        let plain = from_timings(&json!({"predicted_n": 400})).unwrap();
        assert_eq!((plain.drafted, plain.rate()), (0, None));
        assert_eq!(from_timings(&Value::Null), None);
        let sum = a + plain + Acceptance { rounds: Some(1), drafted: 80, accepted: 4 };
        assert_eq!(sum, Acceptance { rounds: None, drafted: 400, accepted: 260 });
    }
}
