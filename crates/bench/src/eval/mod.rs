//! `spindle eval`: a deterministic pass/fail suite of server behaviour against any
//! OpenAI-compatible server, modelled on AFM's assertion suite. Each check sends requests whose
//! correct answer follows from the protocol, not from the model's skill: a stop string taken
//! from the model's own greedy output, usage that must add up, an error status for a bad body.
//!
//! Checks that do depend on the model (did it follow a schema nobody enforced, did it echo what
//! it was asked to) are [`Dependence::Model`]: reported apart, never failing the run.
//!
//! Sections, one module each: `sampling` (stop strings, max_tokens, logprobs, replay, seed
//! parity), `tools` (tool calls, tool_choice, strict json_schema), `reasoning` (split and
//! budget), `serving` (prefix cache, concurrency isolation and parity), `protocol` (error codes
//! and shapes, CORS, usage accounting). [`report`] prints and writes the results.

mod checks_protocol;
mod checks_reasoning;
mod checks_sampling;
mod checks_serving;
mod checks_tools;
pub mod report;
mod wire;

use std::fmt::Display;

use crate::client::Client;

/// How much of the suite runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// A handful of fast checks: stop, max_tokens, replay, prefix cache, usage, error codes
    /// (bad body, unknown route), CORS.
    Smoke,
    /// Every server check.
    Standard,
    /// Standard with more repetitions and larger concurrency.
    Full,
}

impl Tier {
    /// The tiers' names on the command line, in order.
    pub const NAMES: [&'static str; 3] = ["smoke", "standard", "full"];

    /// The tier named `name` (one of [`Tier::NAMES`]).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "smoke" => Some(Tier::Smoke),
            "standard" => Some(Tier::Standard),
            "full" => Some(Tier::Full),
            _ => None,
        }
    }

    /// Concurrent requests of the isolation and parity checks.
    fn concurrency(self) -> usize {
        if self == Tier::Full {
            16
        } else {
            8
        }
    }

    /// Times the replay check sends the same request.
    fn replays(self) -> usize {
        if self == Tier::Full {
            5
        } else {
            2
        }
    }
}

/// The sections, in the order they run.
pub const SECTIONS: [&str; 5] = ["sampling", "tools", "reasoning", "serving", "protocol"];

/// Whether a check judges the server or the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependence {
    /// The protocol fixes the answer: a failure is the server's.
    Server,
    /// The answer rests on the model's ability; reported apart, never failing the run.
    Model,
}

impl Display for Dependence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dependence::Server => "server",
            Dependence::Model => "model-dependent",
        })
    }
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    /// The behaviour cannot be provoked here (no reasoning model, no API key, …).
    Skip,
}

impl Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        })
    }
}

/// One check's verdict with what it expected and what it saw.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckResult {
    pub section: &'static str,
    pub name: &'static str,
    pub dependence: Dependence,
    pub outcome: Outcome,
    pub expected: String,
    /// What the server answered, or why the check was skipped.
    pub actual: String,
}

/// A check about to be judged: its name and what it expects.
pub(crate) struct Check {
    section: &'static str,
    name: &'static str,
    dependence: Dependence,
    expected: String,
}

impl Check {
    pub(crate) fn server(section: &'static str, name: &'static str, expected: &str) -> Self {
        let expected = expected.to_string();
        Self { section, name, dependence: Dependence::Server, expected }
    }

    pub(crate) fn model(section: &'static str, name: &'static str, expected: &str) -> Self {
        Self { dependence: Dependence::Model, ..Self::server(section, name, expected) }
    }

    fn done(self, outcome: Outcome, actual: String) -> CheckResult {
        CheckResult {
            section: self.section,
            name: self.name,
            dependence: self.dependence,
            outcome,
            expected: self.expected,
            actual,
        }
    }

    pub(crate) fn judge(self, passed: bool, actual: impl Into<String>) -> CheckResult {
        let outcome = if passed { Outcome::Pass } else { Outcome::Fail };
        self.done(outcome, actual.into())
    }

    pub(crate) fn skip(self, why: impl Into<String>) -> CheckResult {
        self.done(Outcome::Skip, why.into())
    }

    /// A failure to get any answer to judge (the request failed, the body was not JSON).
    pub(crate) fn error(self, error: impl Display) -> CheckResult {
        self.done(Outcome::Fail, format!("request failed: {error}"))
    }

    /// Judges the `Ok` of `verdict`, or fails with its `Err` (a request that failed).
    pub(crate) fn judge_result<E: Display>(
        self,
        verdict: Result<(bool, String), E>,
    ) -> CheckResult {
        match verdict {
            Ok((passed, actual)) => self.judge(passed, actual),
            Err(e) => self.error(e),
        }
    }
}

/// The server under test and how hard to test it.
pub struct EvalContext {
    pub client: Client,
    pub tier: Tier,
    /// Requests the server holds at once (running + waiting), when known: the queue-full check
    /// sends more than that at once and expects 429. Unknown: the check is skipped.
    pub queue_capacity: Option<usize>,
    /// Makes the prompts of this run unique (no cache of an earlier run serves them).
    pub salt: u64,
}

impl EvalContext {
    fn runs(&self, tier: Tier) -> bool {
        self.tier >= tier
    }
}

/// Runs the sections (all, or the one named) in order; `on_section` hears each section's
/// results as it finishes. `Err` names an unknown section.
pub async fn run_eval(
    context: &EvalContext,
    section: Option<&str>,
    on_section: &mut impl FnMut(&[CheckResult]),
) -> Result<Vec<CheckResult>, String> {
    if let Some(name) = section.filter(|s| !SECTIONS.contains(s)) {
        return Err(format!("unknown section `{name}`; expected one of {}", SECTIONS.join(", ")));
    }
    let mut all = Vec::new();
    for name in SECTIONS.into_iter().filter(|s| section.is_none_or(|wanted| wanted == *s)) {
        let results = match name {
            "sampling" => checks_sampling::run(context).await,
            "tools" => checks_tools::run(context).await,
            "reasoning" => checks_reasoning::run(context).await,
            "serving" => checks_serving::run(context).await,
            _ => checks_protocol::run(context).await,
        };
        on_section(&results);
        all.extend(results);
    }
    Ok(all)
}

/// Whether the run passes: no server check failed (model-dependent ones do not count).
pub fn passed(results: &[CheckResult]) -> bool {
    !results.iter().any(|r| r.dependence == Dependence::Server && r.outcome == Outcome::Fail)
}

/// How many results of `dependence` had `outcome`.
pub fn count(results: &[CheckResult], dependence: Dependence, outcome: Outcome) -> usize {
    results.iter().filter(|r| r.dependence == dependence && r.outcome == outcome).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(dependence: Dependence, outcome: Outcome) -> CheckResult {
        CheckResult {
            section: "sampling",
            name: "x",
            dependence,
            outcome,
            expected: String::new(),
            actual: String::new(),
        }
    }

    #[test]
    fn only_server_failures_fail_the_run() {
        let model_fail = result(Dependence::Model, Outcome::Fail);
        let skip = result(Dependence::Server, Outcome::Skip);
        assert!(passed(&[model_fail.clone(), skip.clone()]));
        assert!(!passed(&[model_fail, skip, result(Dependence::Server, Outcome::Fail)]));
    }

    #[test]
    fn tiers_order_and_names() {
        assert!(Tier::Smoke < Tier::Standard && Tier::Standard < Tier::Full);
        assert_eq!(
            Tier::NAMES.map(Tier::from_name),
            [Tier::Smoke, Tier::Standard, Tier::Full].map(Some)
        );
        assert_eq!(Tier::from_name("quick"), None);
        assert!(Tier::Full.concurrency() > Tier::Standard.concurrency());
    }

    #[test]
    fn judge_and_error_keep_expected_and_actual() {
        let r = Check::server("protocol", "x", "400").judge(false, "500");
        assert_eq!(
            (r.outcome, r.expected.as_str(), r.actual.as_str()),
            (Outcome::Fail, "400", "500")
        );
        let r = Check::model("tools", "y", "a call").error("timeout");
        assert_eq!((r.dependence, r.outcome), (Dependence::Model, Outcome::Fail));
        assert_eq!(r.actual, "request failed: timeout");
    }
}
