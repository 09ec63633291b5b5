//! The engine with its prefix cache, end to end: a request resumed from the cache
//! gives exactly (token ids, text, logprob bits) what it gives cold, concurrent requests sharing
//! a cached system prompt never see each other's tokens, eviction under a tiny cap stays exact,
//! and the outputs do not depend on how many requests run beside them.
//!
//! Two models: the tiny random dense model (attention only, Qwen3's tokenizer) and the tiny Qwen3.5-MoE hybrid
//! fixture (linear-attention layers, so a resume also restores a recurrent-state snapshot). The
//! hybrid's vocabulary has 512 tokens, so its prompts are made-up ids and its outputs end at
//! `max_tokens` (no stop ids); its text comes from SmolLM2's tokenizer, which is only there to
//! exercise the text path.
//!
//! "Cold" always means a fresh engine, where nothing can be cached.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use spindle_hub::ModelFiles;
use spindle_models::{KvType, PagedKv};
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{
    model_fingerprint, CacheConfig, Engine, EngineConfig, FinishReason, ModelBundle,
};
use spindle_runner::{
    sequence_channel, RunnerError, SequenceEvent, SequenceEvents, SequenceRequest,
};

/// Prefill chunk of every engine here: small, so the system prompts span more than one chunk,
/// and not a multiple of the block size, so chunks end inside blocks.
const CHUNK: usize = 20;
const BLOCK: usize = 16;

struct Model {
    name: &'static str,
    bundle: Arc<ModelBundle>,
    stop_ids: Vec<u32>,
}

impl Model {
    fn block_bytes(&self) -> usize {
        PagedKv::block_bytes(&self.bundle.model.kv_shapes(), KvType::default(), BLOCK)
    }

    fn attention_only(&self) -> bool {
        self.bundle.model.initial_recurrent_state().is_empty()
    }

    /// Where `prompt` resumes once `earlier` is cached, when the two share a snapshot at
    /// `snapshot`: on an attention-only model wherever they part (short of `prompt`'s end, whose
    /// logits are not cached), on a hybrid one at the snapshot.
    fn resumes_at(&self, earlier: &[u32], prompt: &[u32], snapshot: usize) -> usize {
        if !self.attention_only() {
            return snapshot;
        }
        let shared = earlier.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        shared.min(prompt.len() - 1)
    }

    /// Bytes of one end-of-prompt snapshot: the recurrent state and the logits.
    fn snapshot_bytes(&self) -> usize {
        self.bundle.model.initial_recurrent_state().bytes()
            + self.bundle.model.config().vocab_size * 4
    }
}

fn smollm2_bundle() -> ModelBundle {
    static PULL: Mutex<()> = Mutex::new(());
    let files = {
        let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
        spindle_hub::resolve(
            "smollm2-135m",
            &spindle_hub::spindle_home(),
            spindle_hub::WhenMissing::Download,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    ModelBundle::load(&files).unwrap()
}

/// The tiny random dense model, stopping at its end-of-sequence tokens.
fn dense() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let bundle = common::tiny_dense();
        let stop_ids = bundle.tokenizer.eos_token_ids().to_vec();
        Model { name: "tiny random dense", bundle, stop_ids }
    })
}

/// The tiny hybrid fixture with SmolLM2's tokenizer and template.
fn hybrid() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5_moe");
        let model = spindle_models::load_safetensors(&dir).unwrap();
        let fingerprint = model_fingerprint(&ModelFiles::Safetensors { dir }).unwrap();
        let ModelBundle { tokenizer, template, sampling, .. } = smollm2_bundle();
        let bundle = ModelBundle { model, tokenizer, template, fingerprint, sampling };
        Model { name: "qwen3_5_moe fixture", bundle: Arc::new(bundle), stop_ids: Vec::new() }
    })
}

/// One request as the tests vary it; everything else is fixed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Request {
    prompt: Vec<u32>,
    snapshots: Vec<usize>,
    /// `None`: greedy; `Some`: temperature 0.9 with this seed.
    seed: Option<u64>,
    max_tokens: usize,
}

/// What a sequence produced, with the logprobs as bits so equality is exact.
#[derive(Clone, Debug, PartialEq)]
struct Generated {
    ids: Vec<u32>,
    logprobs: Vec<u32>,
    top_logprobs: Vec<Vec<(u32, u32)>>,
    text: String,
    finish: FinishReason,
}

#[derive(Debug)]
struct Run {
    out: Generated,
    cached: usize,
}

fn sampling(seed: Option<u64>) -> SamplingParams {
    let temperature = if seed.is_some() { 0.9 } else { 0.0 };
    SamplingParams { temperature, seed, top_logprobs: Some(3), ..Default::default() }
}

fn cache_config(kv_bytes: usize, snapshot_bytes: usize) -> CacheConfig {
    CacheConfig {
        kv_bytes,
        snapshot_bytes,
        block_size: BLOCK,
        kv_type: KvType::default(),
        ..CacheConfig::default()
    }
}

/// Room for every test's sequences and prefixes at once.
fn roomy(model: &Model) -> CacheConfig {
    cache_config(model.block_bytes() * 256, 1 << 30)
}

fn engine(model: &Model, max_active: usize, cache: CacheConfig) -> Engine {
    Engine::start(
        model.bundle.clone(),
        EngineConfig {
            max_active,
            prefill_chunk: CHUNK,
            step_tokens: 2 * CHUNK,
            cache,
            orphan_prefill_tokens: usize::MAX,
            fault_injection: None,
            speculation: Default::default(),
        },
    )
}

fn submit(engine: &Engine, model: &Model, request: &Request) -> SequenceEvents {
    let (caller, receiver) = sequence_channel();
    engine
        .submit(
            SequenceRequest {
                snapshot_positions: request.snapshots.clone(),
                stop_ids: model.stop_ids.clone(),
                ..SequenceRequest::plain(
                    request.prompt.clone(),
                    request.max_tokens,
                    sampling(request.seed),
                    4096,
                )
            },
            caller,
        )
        .unwrap();
    receiver
}

fn next_event(receiver: &mut SequenceEvents) -> SequenceEvent {
    receiver.blocking_recv().expect("the engine dropped a sequence without a final event")
}

/// Reads a sequence's events to its end; `Err` with the error of a `Failed` event.
fn collect(receiver: &mut SequenceEvents, request: &Request) -> Result<Run, RunnerError> {
    let (mut ids, mut logprobs, mut top_logprobs, mut text) =
        (Vec::new(), Vec::new(), Vec::new(), String::new());
    loop {
        match next_event(receiver) {
            SequenceEvent::Token { token, text: delta, .. } => {
                ids.push(token.id);
                logprobs.push(token.logprob.to_bits());
                top_logprobs
                    .push(token.top_logprobs.iter().map(|&(id, lp)| (id, lp.to_bits())).collect());
                text.push_str(&delta.reasoning);
                text.push_str(&delta.content);
            }
            SequenceEvent::Finished(summary) => {
                text.push_str(&summary.tail.reasoning);
                text.push_str(&summary.tail.content);
                assert_eq!(summary.prompt_tokens, request.prompt.len());
                assert_eq!(summary.completion_tokens, ids.len());
                assert!(summary.cached_tokens <= request.prompt.len());
                let out =
                    Generated { ids, logprobs, top_logprobs, text, finish: summary.finish_reason };
                return Ok(Run { out, cached: summary.cached_tokens });
            }
            SequenceEvent::Prefilled { .. } => {}
            SequenceEvent::Failed(error) => return Err(error),
        }
    }
}

/// Runs `requests` on `engine` in waves of `concurrency` submitted together, each wave read to
/// its end before the next is submitted; results in request order.
fn run_waves(engine: &Engine, model: &Model, requests: &[Request], concurrency: usize) -> Vec<Run> {
    let mut runs = Vec::new();
    for wave in requests.chunks(concurrency) {
        let mut receivers: Vec<_> = wave.iter().map(|r| submit(engine, model, r)).collect();
        for (receiver, request) in receivers.iter_mut().zip(wave) {
            runs.push(
                collect(receiver, request)
                    .unwrap_or_else(|e| panic!("{}: {request:?} failed: {e}", model.name)),
            );
        }
    }
    runs
}

fn run_one(engine: &Engine, model: &Model, request: &Request) -> Run {
    run_waves(engine, model, std::slice::from_ref(request), 1).pop().unwrap()
}

/// `request` alone on a fresh engine (remembered: the same cold run is wanted by several tests).
fn cold(model: &Model, request: &Request) -> Generated {
    static COLD: OnceLock<Mutex<HashMap<(&'static str, Request), Generated>>> = OnceLock::new();
    let memo = COLD.get_or_init(Default::default);
    let key = (model.name, request.clone());
    if let Some(out) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return out.clone();
    }
    let run = run_one(&engine(model, 1, roomy(model)), model, request);
    assert_eq!(run.cached, 0, "{}: a fresh engine reported cached tokens", model.name);
    assert!(!run.out.ids.is_empty(), "{}: {request:?} generated nothing", model.name);
    memo.lock().unwrap_or_else(|e| e.into_inner()).insert(key, run.out.clone());
    run.out
}

fn assert_matches_cold(model: &Model, run: &Run, request: &Request, what: &str) {
    let cold = cold(model, request);
    assert!(
        run.out == cold,
        "{}: {what} differs from its cold run\n  got:  {:?}\n  cold: {:?}",
        model.name,
        run.out,
        cold
    );
}

/// Prompts in two parts: a shared system prompt (`system.len()` tokens, a snapshot position)
/// and per-request user turns.
struct Prompts {
    system: Vec<u32>,
    users: Vec<Vec<u32>>,
}

impl Prompts {
    fn request(&self, user: usize, seed: Option<u64>, max_tokens: usize) -> Request {
        let prompt = [self.system.as_slice(), &self.users[user]].concat();
        Request { prompt, snapshots: vec![self.system.len()], seed, max_tokens }
    }

    /// A prompt that is all user turn: nothing in common with the others.
    fn alone(&self, user: usize, seed: Option<u64>, max_tokens: usize) -> Request {
        Request { prompt: self.users[user].clone(), snapshots: Vec::new(), seed, max_tokens }
    }
}

const SYSTEM: &str = "You are the assistant of a small bakery in Lyon. Answer briefly and politely, and never invent prices.";
const QUESTIONS: [&str; 10] = [
    "When do you open on Sundays?",
    "Do you sell sourdough bread?",
    "What is a croissant made of?",
    "Can I order a birthday cake?",
    "Is the rye bread vegan?",
    "Do you have gluten-free options?",
    "How should I store a baguette?",
    "What goes well with brioche?",
    "Which pastry do you recommend?",
    "Are your eggs free range?",
];

fn dense_prompts() -> Prompts {
    let tokenizer = &dense().bundle.tokenizer;
    let encode = |text: &str| tokenizer.encode(text, false).unwrap();
    let system = encode(&format!("<|im_start|>system\n{SYSTEM}<|im_end|>\n"));
    let users = QUESTIONS
        .iter()
        .map(|q| encode(&format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")))
        .collect();
    check_system_length(system.len());
    Prompts { system, users }
}

/// Made-up ids below the fixture's vocabulary size (509..512 are its special tokens).
fn ids(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7919 + seed * 104_729 + 17) % 500 + 5).collect()
}

fn hybrid_prompts() -> Prompts {
    let system = ids(45, 1);
    check_system_length(system.len());
    Prompts { system, users: (0..10).map(|u| ids(12 + u as usize % 5, 100 + u)).collect() }
}

/// The system prompt must span more than one prefill chunk and end inside a block, so that a
/// resume takes several chunks' blocks and copies a partly filled one.
fn check_system_length(len: usize) {
    assert!(
        len > CHUNK && !len.is_multiple_of(BLOCK),
        "pick a system prompt of another length than {len} tokens"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. Cold vs cache hit.

/// On one engine: a cold prompt; the identical prompt again (resumes at its end, from the kept
/// logits); another user turn after the same system prompt (resumes at the system prompt, or
/// on an attention-only model where the two part); the same tokens cut into other chunks (a
/// hybrid model must not resume: its chunking differs, so would its bits; an attention-only one
/// computes the same bits under any cuts and resumes at the end).
fn check_cold_vs_cached(model: &Model, prompts: &Prompts, seed: Option<u64>, max_tokens: usize) {
    let engine = engine(model, 4, roomy(model));
    let first = prompts.request(0, seed, max_tokens);
    let other = prompts.request(1, seed, max_tokens);
    let mut rechunked = other.clone();
    rechunked.snapshots = vec![10, prompts.system.len()];
    let s = prompts.system.len();
    let other_resumes_at = model.resumes_at(&first.prompt, &other.prompt, s);
    let rechunked_resumes_at = if model.attention_only() { other.prompt.len() } else { 0 };
    for (request, expected_cached, what) in [
        (&first, 0, "the first prompt"),
        (&first, first.prompt.len(), "the identical prompt"),
        (&other, other_resumes_at, "another user turn after the cached system prompt"),
        (&other, other.prompt.len(), "that prompt again"),
        (&rechunked, rechunked_resumes_at, "the same tokens with other chunk cuts"),
    ] {
        let run = run_one(&engine, model, request);
        let what = format!("{what} (seed {seed:?})");
        assert_eq!(run.cached, expected_cached, "{}: cached tokens of {what}", model.name);
        assert_matches_cold(model, &run, request, &what);
    }
}

#[test]
fn cache_hits_give_the_cold_output_on_the_dense_model() {
    let prompts = dense_prompts();
    check_cold_vs_cached(dense(), &prompts, None, 8);
    check_cold_vs_cached(dense(), &prompts, Some(7), 8);
}

#[test]
fn cache_hits_give_the_cold_output_on_the_hybrid_model() {
    let prompts = hybrid_prompts();
    check_cold_vs_cached(hybrid(), &prompts, None, 24);
    check_cold_vs_cached(hybrid(), &prompts, Some(7), 24);
}

/// Two prompts without snapshot positions that share a long run of tokens and then differ (a
/// changed suffix anywhere, not at a message end): on the dense model the second resumes where
/// the shared run ends and gives its cold output; the hybrid model has no recurrent state there
/// to resume from and prefills it all.
#[test]
fn a_changed_suffix_resumes_where_it_parts_on_an_attention_only_model() {
    let (model, hybrid_model) = (dense(), hybrid());
    let shared = ids(3 * CHUNK + 7, 3);
    for (model, expected) in [(model, shared.len()), (hybrid_model, 0)] {
        let engine = engine(model, 2, roomy(model));
        let request = |tail: u32| Request {
            prompt: [shared.clone(), ids(9, tail)].concat(),
            snapshots: Vec::new(),
            seed: Some(5),
            max_tokens: 6,
        };
        let (first, second) = (request(40), request(41));
        assert_ne!(
            first.prompt[shared.len()],
            second.prompt[shared.len()],
            "the prompts must differ right after the shared run"
        );
        assert_eq!(run_one(&engine, model, &first).cached, 0);
        let run = run_one(&engine, model, &second);
        assert_eq!(run.cached, expected, "{}: cached tokens after a changed suffix", model.name);
        assert_matches_cold(model, &run, &second, "a prompt resumed where it parts");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Concurrent requests on a cached system prompt.

/// Warms the system prompt with one request, then sends 8 with other user turns at once: each
/// resumes from the system prompt (or, on an attention-only model, where it parts from the
/// warming prompt; so all 8 start from the same partly filled block) and must give exactly its
/// own cold output.
fn check_concurrent_shared_prefix(model: &Model, prompts: &Prompts, max_tokens: usize) {
    let engine = engine(model, 8, roomy(model));
    let warming = prompts.request(0, None, max_tokens);
    let warm = run_one(&engine, model, &warming);
    assert_eq!(warm.cached, 0);
    let requests: Vec<Request> =
        (1..=8).map(|u| prompts.request(u, (u % 2 == 0).then_some(u as u64), max_tokens)).collect();
    let runs = run_waves(&engine, model, &requests, requests.len());
    for (i, (run, request)) in runs.iter().zip(&requests).enumerate() {
        assert_eq!(
            run.cached,
            model.resumes_at(&warming.prompt, &request.prompt, prompts.system.len()),
            "{}: request {i} did not resume at the system prompt",
            model.name
        );
        assert_matches_cold(model, run, request, &format!("concurrent request {i}"));
    }
    // Different user turns really give different answers, so a mix-up could not go unseen.
    let distinct: std::collections::HashSet<_> = runs.iter().map(|r| &r.out.ids).collect();
    assert!(distinct.len() > 4, "{}: the user turns hardly change the outputs", model.name);
}

#[test]
fn concurrent_requests_on_a_cached_system_prompt_get_their_own_answers_on_the_dense_model() {
    check_concurrent_shared_prefix(dense(), &dense_prompts(), 8);
}

#[test]
fn concurrent_requests_on_a_cached_system_prompt_get_their_own_answers_on_the_hybrid_model() {
    check_concurrent_shared_prefix(hybrid(), &hybrid_prompts(), 24);
}

// ---------------------------------------------------------------------------------------------
// 3. Eviction under a tiny cap.

/// Largest `max_tokens` (at most `cap`) whose positions stay within the blocks the engine
/// reserves when it admits a prompt of `len` tokens (`len + 1` positions): the last token
/// sampled is never run, so `len + max_tokens - 1` positions are used in all.
fn within_reservation(len: usize, cap: usize) -> usize {
    (BLOCK + 1 - len % BLOCK).min(cap)
}

/// Requests on `prompts` (every other one on the system prompt, every third seeded), their
/// `max_tokens` chosen by `max_tokens(prompt length)`.
fn eviction_requests(prompts: &Prompts, max_tokens: impl Fn(usize) -> usize) -> Vec<Request> {
    (0..prompts.users.len())
        .map(|u| {
            let seed = (u % 3 == 0).then_some(u as u64 + 40);
            let mut request =
                if u % 2 == 0 { prompts.request(u, seed, 0) } else { prompts.alone(u, seed, 0) };
            request.max_tokens = max_tokens(request.prompt.len());
            request
        })
        .collect()
}

/// An engine whose pool has room for the largest of `requests` and 2 blocks more, and whose
/// snapshot store holds two and a half end-of-prompt snapshots.
fn tiny_engine(model: &Model, requests: &[Request]) -> (Engine, usize) {
    let need =
        requests.iter().map(|r| (r.prompt.len() + r.max_tokens).div_ceil(BLOCK)).max().unwrap();
    let blocks = need + 2;
    (
        engine(
            model,
            4,
            cache_config(blocks * model.block_bytes(), model.snapshot_bytes() * 5 / 2),
        ),
        blocks,
    )
}

/// Prompts run one after another and all at once on a tiny cache keep evicting each other's
/// prefixes, and every output still equals its cold run. A prompt larger than the whole pool
/// fails at once with a clear message, without holding up the others.
///
/// Every request fits in the pool beside the others without preemption (see
/// `sequences_are_not_cut_short_when_the_pool_runs_out` and tests/runner/preemption.rs for those that
/// do not).
fn check_eviction(model: &Model, prompts: &Prompts, max_tokens: usize, concurrent_rounds: usize) {
    let requests = eviction_requests(prompts, |len| within_reservation(len, max_tokens));
    let (engine, blocks) = tiny_engine(model, &requests);
    let system_blocks = usize::from(requests.iter().any(|r| !r.snapshots.is_empty()))
        * prompts.system.len()
        / BLOCK;
    let distinct =
        requests.iter().map(|r| r.prompt.len().div_ceil(BLOCK)).sum::<usize>() - system_blocks;
    assert!(
        distinct > blocks,
        "{}: the prompts' {distinct} blocks fit in the pool's {blocks}: nothing to evict",
        model.name
    );

    // One after another, twice, then each prompt twice in a row.
    for (round, request) in requests.iter().chain(&requests).enumerate() {
        let run = run_one(&engine, model, request);
        assert_matches_cold(model, &run, request, &format!("sequential run {round}"));
        if round == requests.len() {
            let others = requests.len() - 1;
            let name = model.name;
            assert!(
                run.cached < request.prompt.len(),
                "{name}: the first prompt survived {others} others in {blocks} blocks"
            );
        }
    }
    for (i, request) in requests.iter().enumerate() {
        run_one(&engine, model, request);
        let again = run_one(&engine, model, request);
        assert_eq!(
            again.cached,
            request.prompt.len(),
            "{}: prompt {i} repeated at once missed the cache",
            model.name
        );
        assert_matches_cold(model, &again, request, &format!("repeat of prompt {i}"));
    }

    // All at once, `concurrent_rounds` times over, with a prompt larger than the pool among them.
    let too_long = Request {
        prompt: ids(blocks * BLOCK + 1, 999),
        snapshots: Vec::new(),
        seed: None,
        max_tokens: 4,
    };
    let all: Vec<&Request> = std::iter::repeat_n(&requests, concurrent_rounds).flatten().collect();
    let mut receivers: Vec<_> = all.iter().map(|r| submit(&engine, model, r)).collect();
    let mut failed = submit(&engine, model, &too_long);
    receivers.extend(requests.iter().map(|r| submit(&engine, model, r)));
    let all = all.into_iter().chain(&requests);
    for (i, (receiver, request)) in receivers.iter_mut().zip(all).enumerate() {
        let run = collect(receiver, request)
            .unwrap_or_else(|e| panic!("{}: concurrent request {i} failed: {e}", model.name));
        assert_matches_cold(
            model,
            &run,
            request,
            &format!("concurrent request {i} under the tiny cap"),
        );
    }
    let error =
        collect(&mut failed, &too_long).expect_err("a prompt larger than the pool must fail");
    assert!(
        matches!(error, RunnerError::PromptExceedsKvPool { prompt, .. } if prompt == too_long.prompt.len()),
        "{error:?}"
    );
}

#[test]
fn eviction_under_a_tiny_cap_keeps_outputs_exact_on_the_dense_model() {
    let mut prompts = dense_prompts();
    prompts.users.truncate(4);
    check_eviction(dense(), &prompts, 6, 0);
}

#[test]
fn eviction_under_a_tiny_cap_keeps_outputs_exact_on_the_hybrid_model() {
    check_eviction(hybrid(), &hybrid_prompts(), 12, 2);
}

/// Sequences that need blocks beyond those reserved at admission, four at a time in a pool too
/// small for all of them: each must still give its whole cold output.
#[test]
fn sequences_are_not_cut_short_when_the_pool_runs_out() {
    let model = hybrid();
    let requests = eviction_requests(&hybrid_prompts(), |_| 24);
    let (engine, _) = tiny_engine(model, &requests);
    let mut receivers: Vec<_> = requests.iter().map(|r| submit(&engine, model, r)).collect();
    for (i, (receiver, request)) in receivers.iter_mut().zip(&requests).enumerate() {
        let run = collect(receiver, request).unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        assert_eq!(
            run.out.ids.len(),
            request.max_tokens,
            "request {i} was cut short (finish reason {:?})",
            run.out.finish
        );
        assert_matches_cold(model, &run, request, &format!("request {i}"));
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Batch invariance.

/// Sixteen requests (greedy and seeded; twelve on the shared system prompt with `users` user
/// turns, an identical pair, two with nothing shared), run with 1, 4 and 16 sequences at once
/// and submitted in waves of as many, each time on a fresh engine and then again on the same
/// engine (from the cache): the outputs are the same bits every time.
fn check_batch_invariance(model: &Model, prompts: &Prompts, users: usize, max_tokens: usize) {
    let mut requests: Vec<Request> = (0..12)
        .map(|i| prompts.request(i % users, (i % 3 != 0).then_some(i as u64), max_tokens))
        .collect();
    requests.push(prompts.request(0, Some(3), max_tokens));
    requests.push(prompts.request(0, Some(3), max_tokens));
    requests.push(prompts.alone(8, None, max_tokens));
    requests.push(prompts.alone(9, Some(5), max_tokens));
    assert_eq!(requests.len(), 16);

    let mut reference: Option<Vec<Generated>> = None;
    for concurrency in [1, 4, 16] {
        let engine = engine(model, concurrency, roomy(model));
        for pass in ["first", "cached"] {
            let runs = run_waves(&engine, model, &requests, concurrency);
            if pass == "cached" {
                for (i, (run, request)) in runs.iter().zip(&requests).enumerate() {
                    let name = model.name;
                    assert_eq!(
                        run.cached,
                        request.prompt.len(),
                        "{name}: request {i} of the cached pass missed the cache"
                    );
                }
            }
            let outs: Vec<Generated> = runs.into_iter().map(|r| r.out).collect();
            match &reference {
                None => reference = Some(outs),
                Some(reference) => {
                    for (i, (out, expected)) in outs.iter().zip(reference).enumerate() {
                        let at = format!(
                            "{}: request {i} differs at concurrency {concurrency} ({pass} pass)",
                            model.name
                        );
                        assert!(
                            out == expected,
                            "{at}\n  got:      {out:?}\n  expected: {expected:?}"
                        );
                    }
                }
            }
        }
    }
    let reference = reference.unwrap();
    assert_eq!(reference[12], reference[13]);
    // Check one fully cold output too, so the set is not merely self-consistent.
    assert_eq!(reference[14], cold(model, &requests[14]));
}

#[test]
fn outputs_are_bitwise_identical_at_1_4_and_16_concurrency_on_the_dense_model() {
    check_batch_invariance(dense(), &dense_prompts(), 4, 5);
}

#[test]
fn outputs_are_bitwise_identical_at_1_4_and_16_concurrency_on_the_hybrid_model() {
    check_batch_invariance(hybrid(), &hybrid_prompts(), 8, 16);
}
