//! The speculation panel: decode speed and draft acceptance on three workloads of different
//! copyability ([`workloads`]), with speculative decoding on and off.
//!
//! Every call is greedy (temperature 0; prose sampled, see [`workloads`]) with a fixed seed and
//! streamed; its decode speed runs from
//! the first to the last token ([`stream`]). Against Spindle one server gives both rows: each
//! request says `"speculative": true` or `false`. Against a server without that field
//! (llama-server), [`Mode::Server`] leaves it out and the row is whatever the server was started
//! with; the side-by-side script starts one per setting.
//!
//! Each round takes a new version of every request (its seed picks it) and runs speculation on
//! before off: Spindle drafts from the outputs it finished lately too, and an answer it had
//! already given would be drafted whole. Before a workload's measured calls, one call of a single
//! token puts its prompt in the server's cache, so every mode decodes after the same cached
//! prefill. Speculation always runs first, so it alone had decoded after a cold prefill, which
//! measured slower in some calls (plain prose on Qwen2.5-Coder-0.5B, 2 cores: 27.6 tok/s cold
//! against 33.5 cached; identical cached calls differ by up to 7 %).

pub mod acceptance;
pub mod report;
pub mod stream;
pub mod workloads;

use serde_json::json;

use crate::error::BenchError;
use crate::stats::Spread;
use crate::Client;
use acceptance::{from_timings, Acceptance, Counters, Source};
use stream::{streamed_chat, Streamed};
use workloads::{fidelity, request, self_repeat, Kind, Request};

/// The sampling seed of every call (the same answer on every run of a server, prose too).
pub const SEED: u64 = 1234;

/// How a call asks for speculation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// `"speculative": true`.
    On,
    /// `"speculative": false`.
    Off,
    /// The field left out: the server's own setting.
    Server,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::On => "spec",
            Mode::Off => "plain",
            Mode::Server => "server",
        }
    }

    /// The `speculative` field of the request, if any.
    fn field(self) -> Option<bool> {
        match self {
            Mode::On => Some(true),
            Mode::Off => Some(false),
            Mode::Server => None,
        }
    }
}

/// What the panel runs.
#[derive(Debug, Clone)]
pub struct SpeculationOptions {
    pub kinds: Vec<Kind>,
    /// In the order each round runs them.
    pub modes: Vec<Mode>,
    pub rounds: usize,
    pub max_tokens: u32,
    /// Round `r` takes version `salt + r` of each request.
    pub salt: u64,
}

/// One measured call.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecCall {
    pub round: usize,
    pub variant: usize,
    pub decode_tokens_per_second: f64,
    pub completion_tokens: u32,
    /// From the first to the last token, in seconds.
    pub decode_seconds: f64,
    pub acceptance: Option<(Acceptance, Source)>,
    /// Share of the expected answer's lines the reply has ([`workloads::fidelity`]).
    pub fidelity: Option<f64>,
    /// Share of the reply that repeats itself ([`workloads::self_repeat`]).
    pub self_repeat: Option<f64>,
    pub reply: String,
}

/// Every call of one workload in one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecRow {
    pub kind: Kind,
    pub mode: Mode,
    pub calls: Vec<SpecCall>,
}

impl SpecRow {
    /// Decode tokens/s over the rounds: median [min–max].
    pub fn decode(&self) -> Option<Spread> {
        let speeds: Vec<f64> = self.calls.iter().map(|c| c.decode_tokens_per_second).collect();
        Spread::of(&speeds)
    }

    /// Drafted and accepted over all calls; `None` when no call had figures.
    pub fn acceptance(&self) -> Option<Acceptance> {
        let mut figures = self.calls.iter().filter_map(|c| c.acceptance.map(|(a, _)| a));
        let first = figures.next()?;
        Some(figures.fold(first, |sum, a| sum + a))
    }

    pub fn completion_tokens(&self) -> Option<Spread> {
        let tokens: Vec<f64> = self.calls.iter().map(|c| f64::from(c.completion_tokens)).collect();
        Spread::of(&tokens)
    }

    pub fn fidelity(&self) -> Option<Spread> {
        Spread::of(&self.calls.iter().filter_map(|c| c.fidelity).collect::<Vec<_>>())
    }

    pub fn self_repeat(&self) -> Option<Spread> {
        Spread::of(&self.calls.iter().filter_map(|c| c.self_repeat).collect::<Vec<_>>())
    }
}

/// All rows of a run, workload by workload.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpeculationPanel {
    pub rows: Vec<SpecRow>,
}

impl SpeculationPanel {
    pub fn row(&self, kind: Kind, mode: Mode) -> Option<&SpecRow> {
        self.rows.iter().find(|r| r.kind == kind && r.mode == mode)
    }

    /// The workloads measured, in order.
    pub fn kinds(&self) -> Vec<Kind> {
        let mut kinds: Vec<Kind> = self.rows.iter().map(|r| r.kind).collect();
        kinds.dedup();
        kinds
    }

    /// Median decode speed with speculation over without, where both ran.
    pub fn speedup(&self, kind: Kind) -> Option<f64> {
        let on = self.row(kind, Mode::On)?.decode()?.median;
        let off = self.row(kind, Mode::Off)?.decode()?.median;
        (off > 0.0).then(|| on / off)
    }

    /// Whether every call of the workload answered the same for its version: speculation must
    /// not change a greedy answer. `None` when no version ran twice.
    pub fn outputs_agree(&self, kind: Kind) -> Option<bool> {
        let calls = self.rows.iter().filter(|r| r.kind == kind).flat_map(|r| &r.calls);
        let mut by_variant: std::collections::HashMap<usize, Vec<&str>> = Default::default();
        calls.for_each(|c| by_variant.entry(c.variant).or_default().push(&c.reply));
        let repeated: Vec<_> = by_variant.values().filter(|r| r.len() > 1).collect();
        (!repeated.is_empty()).then(|| repeated.iter().all(|r| r.iter().all(|x| *x == r[0])))
    }
}

/// Runs every round: each workload in each mode, one call at a time. `progress` hears what
/// runs next.
pub async fn run_speculation(
    client: &Client,
    options: &SpeculationOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<SpeculationPanel, BenchError> {
    let mut rows: Vec<SpecRow> = options
        .kinds
        .iter()
        .flat_map(|&kind| {
            options.modes.iter().map(move |&mode| SpecRow { kind, mode, calls: vec![] })
        })
        .collect();
    for round in 0..options.rounds {
        let variant = (options.salt as usize).wrapping_add(round);
        for (i, row) in rows.iter_mut().enumerate() {
            let text = format!(
                "round {}/{}: {} [{}] (call {} of {})",
                round + 1,
                options.rounds,
                row.kind,
                row.mode.name(),
                i + 1,
                options.kinds.len() * options.modes.len()
            );
            progress(&text);
            if i % options.modes.len() == 0 {
                warm(client, row.kind, variant).await?;
            }
            let call = measure(client, row.kind, row.mode, variant, options.max_tokens).await?;
            row.calls.push(SpecCall { round, ..call });
        }
    }
    Ok(SpeculationPanel { rows })
}

/// One call of a single token (too short to draft) that leaves the prompt in the server's cache.
async fn warm(client: &Client, kind: Kind, variant: usize) -> Result<(), BenchError> {
    streamed_chat(client, body(&request(kind, variant), Mode::Server, 1)).await.map(drop)
}

/// One call, with the server's drafting counters read around it.
async fn measure(
    client: &Client,
    kind: Kind,
    mode: Mode,
    variant: usize,
    max_tokens: u32,
) -> Result<SpecCall, BenchError> {
    let request = request(kind, variant);
    let before = counters(client).await;
    let streamed = streamed_chat(client, body(&request, mode, max_tokens)).await?;
    let after = counters(client).await;
    Ok(call_of(&streamed, before.zip(after), &request.expected, request.variant))
}

/// The chat body of `request` in `mode`.
fn body(request: &Request, mode: Mode, max_tokens: u32) -> serde_json::Value {
    let mut body = json!({"messages": request.messages, "temperature": request.temperature,
        "seed": SEED, "max_tokens": max_tokens});
    if request.frequency_penalty > 0.0 {
        body["frequency_penalty"] = request.frequency_penalty.into();
    }
    if let Some(tools) = &request.tools {
        body["tools"] = tools.clone();
    }
    if let Some(on) = mode.field() {
        body["speculative"] = on.into();
    }
    body
}

async fn counters(client: &Client) -> Option<Counters> {
    Counters::parse(&client.metrics().await?)
}

/// The call's figures: acceptance from the counters when the server keeps them (Spindle), else
/// from the stream's timings (llama-server).
fn call_of(
    streamed: &Streamed,
    counters: Option<(Counters, Counters)>,
    expected: &str,
    variant: usize,
) -> SpecCall {
    let from_metrics = counters.map(|(before, after)| (before.since(&after), Source::Metrics));
    let from_stream =
        || streamed.timings.as_ref().and_then(from_timings).map(|a| (a, Source::Timings));
    let reply = streamed.reply();
    let decode_seconds = match (streamed.first_token, streamed.last_token) {
        (Some(first), Some(last)) => last.saturating_sub(first).as_secs_f64(),
        _ => 0.0,
    };
    SpecCall {
        round: 0,
        variant,
        decode_tokens_per_second: streamed.decode_tokens_per_second(),
        completion_tokens: streamed.completion_tokens,
        decode_seconds,
        acceptance: from_metrics.or_else(from_stream),
        fidelity: fidelity(expected, &reply),
        self_repeat: self_repeat(&reply),
        reply,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn call(variant: usize, speed: f64, drafted: u64, accepted: u64, reply: &str) -> SpecCall {
        SpecCall {
            round: 0,
            variant,
            decode_tokens_per_second: speed,
            completion_tokens: 100,
            decode_seconds: 99.0 / speed,
            acceptance: Some((Acceptance { rounds: Some(1), drafted, accepted }, Source::Metrics)),
            fidelity: Some(1.0),
            self_repeat: Some(0.25),
            reply: reply.into(),
        }
    }

    pub fn panel() -> SpeculationPanel {
        let row = |mode, calls| SpecRow { kind: Kind::CodeEdit, mode, calls };
        SpeculationPanel {
            rows: vec![
                row(
                    Mode::On,
                    vec![
                        call(1, 60.0, 100, 90, "a"),
                        call(2, 40.0, 50, 30, "b"),
                        call(3, 50.0, 10, 10, "c"),
                    ],
                ),
                row(
                    Mode::Off,
                    vec![
                        call(1, 20.0, 0, 0, "a"),
                        call(2, 30.0, 0, 0, "b"),
                        call(3, 25.0, 0, 0, "c"),
                    ],
                ),
            ],
        }
    }

    #[test]
    fn rows_summarise_median_min_max_and_summed_acceptance() {
        let p = panel();
        let on = p.row(Kind::CodeEdit, Mode::On).unwrap();
        assert_eq!(on.decode(), Some(Spread { median: 50.0, min: 40.0, max: 60.0 }));
        let a = on.acceptance().unwrap();
        assert_eq!((a.drafted, a.accepted, a.rounds), (160, 130, Some(3)));
        assert_eq!(a.rate(), Some(130.0 / 160.0));
        assert_eq!(p.speedup(Kind::CodeEdit), Some(2.0));
        assert_eq!(p.speedup(Kind::Prose), None);
        assert_eq!(p.outputs_agree(Kind::CodeEdit), Some(true));
        assert_eq!(p.kinds(), [Kind::CodeEdit]);
    }

    #[test]
    fn a_changed_answer_or_missing_figures_show() {
        let mut p = panel();
        p.rows[1].calls[2].reply = "c'".into();
        assert_eq!(p.outputs_agree(Kind::CodeEdit), Some(false));
        p.rows[1].calls.iter_mut().for_each(|c| c.acceptance = None);
        assert_eq!(p.rows[1].acceptance(), None);
        p.rows.truncate(1);
        p.rows[0].calls.truncate(1);
        assert_eq!(p.outputs_agree(Kind::CodeEdit), None, "no version ran twice");
    }

    #[test]
    fn metrics_win_over_timings_and_timings_stand_in() {
        let streamed = Streamed {
            first_token: Some(std::time::Duration::from_secs(1)),
            last_token: Some(std::time::Duration::from_secs(3)),
            completion_tokens: 21,
            content: "x".into(),
            timings: Some(json!({"draft_n": 8, "draft_n_accepted": 6})),
            ..Default::default()
        };
        let c = call_of(&streamed, None, "x", 4);
        assert_eq!(c.acceptance.unwrap().1, Source::Timings);
        assert_eq!(
            (c.decode_tokens_per_second, c.decode_seconds, c.fidelity),
            (10.0, 2.0, Some(1.0))
        );
        let zero = Counters::parse(
            "vllm:spec_decode_num_drafts_total 1\nvllm:spec_decode_num_draft_tokens_total 4\n\
             vllm:spec_decode_num_accepted_tokens_total 2\n",
        )
        .unwrap();
        let c = call_of(&streamed, Some((zero, zero)), "", 4);
        assert_eq!(
            c.acceptance.unwrap(),
            (Acceptance { rounds: Some(0), drafted: 0, accepted: 0 }, Source::Metrics)
        );
        assert_eq!(c.fidelity, None);
    }
}
