//! Speculative decoding changes no byte: every request's tokens, logprobs, text and finish are
//! those of the same request decoded plainly, whether its drafts come from the n-gram lookup,
//! from an earlier request's output, or from a script that plants a wrong token at each
//! position of the window; alone or batched with plain sequences; with a grammar that rejects
//! every draft; with stops and `max_tokens` that end inside an accepted run; and the prefix
//! cache it leaves behind serves a follow-up request bit for bit. The mechanics run on the tiny
//! random model; the drafts that are worth taking are checked on SmolLM2 (a random model does
//! not continue repeated code).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use spindle_constrain::{grammar, Grammars};
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{
    sequence_channel, CacheConfig, Canceller, DraftScript, Engine, EngineConfig, FinishReason,
    ModelBundle, SequenceEvents, SequenceRequest, SequenceSummary, SpeculationConfig,
};

use crate::common::{
    collect_summary as collect, greedy, request, seeded, smollm2, tiny_dense, Output, BLOCK_SIZE,
};

pub(crate) const CONTEXT: usize = 1024;

/// Code that repeats itself: the lookup finds what comes next in the prompt.
const REPETITIVE: &str = "def area(width, height):\n    return width * height\n\n\
    def perimeter(width, height):\n    return 2 * (width + height)\n\n\
    def area(width, height):\n    return width * height\n\n\
    def perimeter(width, height):\n    return 2 * (width + height)\n\n\
    def area(";

const PROSE: &str = "The lighthouse keeper wrote in his log every evening. He noted the wind, \
    the colour of the sea, and the ships that passed. One winter night";

/// The pool the speculation tests run on.
pub(crate) fn spec_cache() -> CacheConfig {
    CacheConfig {
        kv_bytes: 64 << 20,
        snapshot_bytes: 64 << 20,
        block_size: BLOCK_SIZE,
        ..CacheConfig::default()
    }
}

/// Speculation where a request asks for it, up to 8 drafts a round.
pub(crate) fn on_request() -> SpeculationConfig {
    SpeculationConfig { by_default: false, max_draft: 8, ..SpeculationConfig::default() }
}

pub(crate) fn start_with(
    bundle: &Arc<ModelBundle>,
    max_active: usize,
    cache: CacheConfig,
    speculation: SpeculationConfig,
) -> Engine {
    Engine::start(
        bundle.clone(),
        EngineConfig { speculation, ..EngineConfig::new(max_active, cache) },
    )
}

pub(crate) fn start(
    bundle: &Arc<ModelBundle>,
    max_active: usize,
    script: Option<DraftScript>,
) -> Engine {
    start_with(bundle, max_active, spec_cache(), SpeculationConfig { script, ..on_request() })
}

pub(crate) fn encode(bundle: &ModelBundle, text: &str) -> Vec<u32> {
    bundle.tokenizer.encode(text, true).unwrap()
}

pub(crate) fn spec_request(
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
    speculative: bool,
) -> SequenceRequest {
    SequenceRequest {
        sampling,
        speculative: Some(speculative),
        ..request(prompt, max_tokens, CONTEXT)
    }
}

pub(crate) fn submit(engine: &Engine, request: SequenceRequest) -> SequenceEvents {
    let (caller, inbox) = sequence_channel();
    engine.submit(request, caller).unwrap();
    inbox
}

pub(crate) fn run(engine: &Engine, request: SequenceRequest) -> (Output, SequenceSummary) {
    collect(submit(engine, request))
}

/// The same client-visible result: tokens, logprobs, text, finish and usage.
pub(crate) fn assert_same(
    spec: &(Output, SequenceSummary),
    plain: &(Output, SequenceSummary),
    what: &str,
) {
    assert_eq!(spec.0, plain.0, "{what}: output");
    let usage = |s: &SequenceSummary| {
        (s.finish_reason, s.stop_sequence.clone(), s.prompt_tokens, s.completion_tokens)
    };
    assert_eq!(usage(&spec.1), usage(&plain.1), "{what}: finish and usage");
    assert_eq!(plain.1.drafted_tokens, 0, "{what}: the plain run drafted");
}

#[test]
fn lookup_drafts_change_no_byte_greedy_or_seeded() {
    // A real model, because what it checks besides identity is that drafts copied from the
    // prompt are taken: a random model does not continue repeated code.
    let bundle = smollm2();
    let engine = start(&bundle, 2, None);
    let top_p = SamplingParams { top_p: 0.9, seed: Some(11), ..seeded() };
    let load = engine.load();
    let counted = || {
        let read = |count: &AtomicUsize| count.load(Ordering::Relaxed);
        (read(&load.spec_draft_tokens), read(&load.spec_accepted_tokens))
    };
    let mut summed = (0, 0);
    for (name, text) in [("repetitive", REPETITIVE), ("prose", PROSE)] {
        let prompt = encode(&bundle, text);
        for (sampling_name, sampling) in
            [("greedy", greedy()), ("seeded", seeded()), ("top_p", top_p.clone())]
        {
            let what = format!("{name}, {sampling_name}");
            // Speculating first: the engine's first request has no earlier output to draft
            // from, so the acceptance counted below is the lookup's own.
            let spec = run(&engine, spec_request(&prompt, sampling.clone(), 48, true));
            // The engine counts a round before the sequence can end in it: once a request has
            // its answer, the counters (/metrics) include all of it.
            summed.0 += spec.1.drafted_tokens;
            summed.1 += spec.1.accepted_tokens;
            assert_eq!(counted(), summed, "{what}: drafted and accepted in the counters");
            let plain = run(&engine, spec_request(&prompt, sampling, 48, false));
            assert_same(&spec, &plain, &what);
            if name == "repetitive" && sampling_name == "greedy" {
                assert!(spec.1.accepted_tokens >= 16, "{what}: {:?}", spec.1);
            }
        }
    }
    assert!(summed.1 > 0);
    let by_position = load.spec_accepted_by_position[0].load(Ordering::Relaxed);
    assert!(by_position > 0 && by_position <= load.spec_drafts.load(Ordering::Relaxed));
}

/// Drafts the plain run's own continuation (`truth`, after `prompt`) for each of `runs`, with
/// one token wrong (another of the `vocab`) at a position that moves along the window round by
/// round: the first, the second, ..., then none, and over again.
pub(crate) fn planted_script(runs: Vec<(Vec<u32>, Vec<u32>)>, vocab: u32) -> DraftScript {
    let round = AtomicUsize::new(0);
    DraftScript(Arc::new(move |history: &[u32], room: usize| {
        let Some((prompt, truth)) = runs.iter().find(|(prompt, _)| history.starts_with(prompt))
        else {
            return Vec::new();
        };
        let decided = history.len() - prompt.len();
        let mut drafts: Vec<u32> = truth.iter().skip(decided).take(room).copied().collect();
        let wrong = round.fetch_add(1, Ordering::Relaxed) % (drafts.len() + 1);
        if let Some(draft) = drafts.get_mut(wrong) {
            *draft = (*draft + 1) % vocab;
        }
        drafts
    }))
}

#[test]
fn a_draft_rejected_at_each_position_changes_no_byte() {
    let bundle = tiny_dense();
    let plain_engine = start(&bundle, 1, None);
    let prompt = encode(&bundle, PROSE);
    for sampling in [greedy(), seeded()] {
        let plain = run(&plain_engine, spec_request(&prompt, sampling.clone(), 40, false));
        let truth: Vec<u32> = plain.0.tokens.iter().map(|t| t.id).collect();
        let engine =
            start(&bundle, 1, Some(planted_script(vec![(prompt.clone(), truth.clone())], 49152)));
        let spec = run(&engine, spec_request(&prompt, sampling.clone(), 40, true));
        assert_same(&spec, &plain, "planted");
        assert!(spec.1.accepted_tokens > 0 && spec.1.accepted_tokens < spec.1.drafted_tokens);
        // A stop string that ends inside an accepted run, and max_tokens inside one.
        let stop = plain.0.text.chars().skip(20).take(6).collect::<String>();
        let stopped = SequenceRequest {
            stop_strings: vec![stop.clone()],
            ..spec_request(&prompt, sampling.clone(), 40, false)
        };
        let plain_stopped = run(&plain_engine, stopped);
        let engine =
            start(&bundle, 1, Some(planted_script(vec![(prompt.clone(), truth.clone())], 49152)));
        let spec_stopped = run(
            &engine,
            SequenceRequest {
                stop_strings: vec![stop.clone()],
                ..spec_request(&prompt, sampling.clone(), 40, true)
            },
        );
        assert_same(&spec_stopped, &plain_stopped, &format!("stop {stop:?}"));
        let short = run(&plain_engine, spec_request(&prompt, sampling.clone(), 7, false));
        let engine = start(&bundle, 1, Some(planted_script(vec![(prompt.clone(), truth)], 49152)));
        assert_same(&run(&engine, spec_request(&prompt, sampling, 7, true)), &short, "max 7");
    }
}

/// A request cancelled while its drafts are in the step (its draft script raises the cancel
/// flag as it drafts, so the verification runs with the flag up): it ends `Cancelled` with a
/// prefix of its plain output, and the sequence beside it and the next request are unchanged.
#[test]
fn a_request_cancelled_mid_verification_changes_nothing_else() {
    let bundle = tiny_dense();
    let (prompt_a, prompt_b) = (encode(&bundle, PROSE), encode(&bundle, REPETITIVE));
    let plain_engine = start(&bundle, 1, None);
    let plain_a = run(&plain_engine, spec_request(&prompt_a, greedy(), 40, false));
    let plain_b = run(&plain_engine, spec_request(&prompt_b, seeded(), 40, false));
    let truth: Vec<u32> = plain_a.0.tokens.iter().map(|t| t.id).collect();
    let cancel_a: Arc<OnceLock<Canceller>> = Arc::default();
    let script = {
        let (cancel_a, prompt_a, truth) = (cancel_a.clone(), prompt_a.clone(), truth.clone());
        DraftScript(Arc::new(move |history: &[u32], room: usize| {
            let Some(decided) = history.strip_prefix(&prompt_a[..]).map(<[u32]>::len) else {
                return Vec::new();
            };
            if decided >= 10 {
                cancel_a.get().expect("set before the request was submitted").cancel();
            }
            truth.iter().skip(decided).take(room).copied().collect()
        }))
    };
    let engine = start(&bundle, 2, Some(script));
    // The flag's handle is in place before the engine sees the request.
    let (caller, inbox_a) = sequence_channel();
    assert!(cancel_a.set(inbox_a.canceller()).is_ok());
    engine.submit(spec_request(&prompt_a, greedy(), 40, true), caller).unwrap();
    let inbox_b = submit(&engine, spec_request(&prompt_b, seeded(), 40, true));
    let (a, b) = (collect(inbox_a), collect(inbox_b));
    assert_eq!(a.1.finish_reason, FinishReason::Cancelled, "{:?}", a.1);
    let sent: Vec<u32> = a.0.tokens.iter().map(|t| t.id).collect();
    assert!(sent.len() >= 10 && sent.len() < truth.len(), "{} tokens", sent.len());
    assert_eq!(sent, truth[..sent.len()], "the cancelled request's tokens");
    assert!(a.1.drafted_tokens > 0, "{:?}", a.1);
    assert_same(&b, &plain_b, "the sequence beside");
    let again = run(&engine, spec_request(&prompt_a, greedy(), 40, false));
    assert_same(&again, &plain_a, "the next request");
}

#[test]
fn speculating_and_plain_sequences_batched_together_change_no_byte() {
    let bundle = tiny_dense();
    let alone = start(&bundle, 1, None);
    let together = start(&bundle, 3, None);
    let prompts = [REPETITIVE, PROSE, REPETITIVE].map(|text| encode(&bundle, text));
    let samplings = [greedy(), seeded(), SamplingParams { seed: Some(3), ..seeded() }];
    let inboxes: Vec<_> = prompts
        .iter()
        .zip(&samplings)
        .enumerate()
        .map(|(i, (p, s))| submit(&together, spec_request(p, s.clone(), 40, i != 1)))
        .collect();
    for (i, inbox) in inboxes.into_iter().enumerate() {
        let batched = collect(inbox);
        let plain = run(&alone, spec_request(&prompts[i], samplings[i].clone(), 40, false));
        assert_same(&batched, &plain, &format!("sequence {i} of 3"));
    }
}

#[test]
fn a_grammar_that_rejects_every_draft_changes_no_byte() {
    let bundle = tiny_dense();
    let grammars = Grammars::new(&bundle.tokenizer).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["name", "count"]
    });
    let constrained = |speculative: bool| SequenceRequest {
        constraint: Some(grammars.compile(grammar::json_schema(&schema)).unwrap()),
        ..spec_request(&encode(&bundle, PROSE), greedy(), 40, speculative)
    };
    let plain = run(&start(&bundle, 1, None), constrained(false));
    // A token no JSON text contains at any point: the grammar masks every draft.
    let never = bundle.tokenizer.token_to_id("<|im_start|>").unwrap();
    let script = DraftScript(Arc::new(move |_: &[u32], room: usize| vec![never; room]));
    let spec = run(&start(&bundle, 1, Some(script)), constrained(true));
    assert_same(&spec, &plain, "every draft rejected");
    assert!(spec.1.drafted_tokens > 0 && spec.1.accepted_tokens == 0, "{:?}", spec.1);
}

#[test]
fn the_cache_a_speculative_run_leaves_serves_the_next_turn_bit_for_bit() {
    let bundle = tiny_dense();
    let prompt = encode(&bundle, REPETITIVE);
    // Drafts of the plain answer with a wrong one planted: rounds that keep some and forget
    // the rest (a random model's own lookup drafts fail and pause).
    let plain = run(&start(&bundle, 1, None), spec_request(&prompt, greedy(), 32, false));
    let truth = plain.0.tokens.iter().map(|t| t.id).collect();
    let warm = start(&bundle, 1, Some(planted_script(vec![(prompt.clone(), truth)], 49152)));
    let first = run(&warm, spec_request(&prompt, greedy(), 32, true));
    assert_same(&first, &plain, "the first turn");
    assert!(first.1.accepted_tokens > 0, "{:?}", first.1);
    // The next turn: the prompt, the reply, more text.
    let mut next: Vec<u32> = prompt.clone();
    next.extend(first.0.tokens.iter().map(|t| t.id));
    next.extend(bundle.tokenizer.encode("\n\nprint(area(3, 4))", false).unwrap());
    let resumed = run(&warm, spec_request(&next, greedy(), 16, false));
    assert!(resumed.1.cached_tokens > prompt.len(), "{:?}", resumed.1);
    let cold = run(&start(&bundle, 1, None), spec_request(&next, greedy(), 16, false));
    assert_eq!(resumed.0, cold.0);
}

#[test]
fn a_request_drafts_from_what_an_earlier_request_wrote() {
    let bundle = smollm2();
    let prompt = encode(&bundle, PROSE);
    for (name, sampling) in [("greedy", greedy()), ("seeded", seeded())] {
        let plain =
            run(&start(&bundle, 1, None), spec_request(&prompt, sampling.clone(), 48, false));
        // Alone, prose gives the lookup little to copy.
        let alone =
            run(&start(&bundle, 1, None), spec_request(&prompt, sampling.clone(), 48, true));
        assert_same(&alone, &plain, &format!("{name}, alone"));
        // After an earlier request wrote the answer (a retry after a client time-out, an
        // agent's repeated call), its tokens are the drafts.
        let engine = start(&bundle, 1, None);
        run(&engine, spec_request(&prompt, sampling.clone(), 48, false));
        let retry = run(&engine, spec_request(&prompt, sampling, 48, true));
        assert_same(&retry, &plain, &format!("{name}, retried"));
        assert!(
            retry.1.accepted_tokens >= 32
                && retry.1.accepted_tokens >= alone.1.accepted_tokens + 16,
            "{name}: retried {:?}, alone {:?}",
            retry.1,
            alone.1
        );
    }
}
