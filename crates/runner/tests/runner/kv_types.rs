//! How far each KV cache type drifts from f32, on the reference prompts (tests/data/reference)
//! through the serving engine. Along f32's greedy continuation of each prompt (teacher forcing:
//! where a type's top-1 differs, a new request goes on from f32's tokens), every step compares
//! the log-probabilities of f32's top-5 tokens under the type with f32's, and whether the
//! type's top-1 is f32's. The README's drift table is this test's output (SmolLM2's served and
//! Qwen2.5's f32-weights rows from the `--ignored` runs); it fails when a type drifts beyond the
//! bounds below.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use spindle_chat::{ChatTemplate, Tokenizer};
use spindle_hub::ModelFiles;
use spindle_models::KvType;
use spindle_runner::sampler::{SampledToken, SamplingParams, MAX_TOP_LOGPROBS};
use spindle_runner::{
    sequence_channel, CacheConfig, Engine, EngineConfig, ModelBundle, SequenceEvent,
    SequenceRequest,
};

/// Positions each run may use; every prompt and its steps fit.
const CONTEXT: usize = 4096;
/// Greedy steps per prompt.
const STEPS: usize = 24;
/// f32's top tokens compared at each step.
const COMPARED: usize = 5;
/// Tokens less likely than this (1%) under f32 are not compared: their logprobs are noise.
const MIN_LOGPROB: f32 = -4.605;

/// The most a type may drift: median and largest logprob difference, and the smallest share
/// of steps whose top-1 is f32's.
struct Bound {
    median: f32,
    max: f32,
    agreement: f32,
}

/// Bounds per model, weights and type: about twice the median and largest difference
/// measured (2026-11-25, in the comments: median / max / top-1 agreement over 4 prompts × 24
/// steps × f32's top-5 tokens of at least 1%), and agreement at most 3 steps below it.
fn bound(model: &str, weights: Weights, kind: KvType) -> Bound {
    let b = |median, max, agree: usize| Bound {
        median,
        max,
        agreement: agree.saturating_sub(3) as f32 / 96.0,
    };
    match (model, weights, kind) {
        // Under 8-bit activations every type moves logprobs about alike.
        ("smollm2-135m", Weights::Served, KvType::F16) => b(0.13, 1.0, 93), // 6.2e-2 / 0.48 / 93
        ("smollm2-135m", Weights::Served, KvType::Bf16) => b(0.11, 1.0, 93), // 5.5e-2 / 0.48 / 93
        ("smollm2-135m", Weights::Served, KvType::Q8_0) => b(0.13, 1.05, 91), // 6.6e-2 / 0.52 / 91
        ("smollm2-135m", Weights::F32, KvType::F16) => b(1.1e-3, 1.3e-2, 96), // 5.2e-4 / 6.3e-3 / 96
        ("smollm2-135m", Weights::F32, KvType::Bf16) => b(7e-3, 0.16, 96), // 3.3e-3 / 7.9e-2 / 96
        ("smollm2-135m", Weights::F32, KvType::Q8_0) => b(3.5e-2, 0.65, 96), // 1.7e-2 / 0.32 / 96
        ("qwen2.5-coder-0.5b", Weights::Served, KvType::F16) => b(7.5e-2, 0.55, 93), // 3.7e-2 / 0.27 / 93
        ("qwen2.5-coder-0.5b", Weights::Served, KvType::Bf16) => b(7e-2, 0.95, 93), // 3.5e-2 / 0.48 / 93
        // Qwen2.5's keys have outlier channels (|k| ≈ 135 in most 32-value blocks of layer 0,
        // against a mean of 18): one q8_0 step is then about 1, and the other values drown.
        ("qwen2.5-coder-0.5b", Weights::Served, KvType::Q8_0) => b(0.26, 10.5, 87), // 0.13 / 5.3 / 87
        ("qwen2.5-coder-0.5b", Weights::F32, KvType::F16) => b(2e-3, 2.5e-2, 96), // 1.0e-3 / 1.2e-2 / 96
        ("qwen2.5-coder-0.5b", Weights::F32, KvType::Bf16) => b(1.7e-2, 0.42, 96), // 8.5e-3 / 0.21 / 96
        ("qwen2.5-coder-0.5b", Weights::F32, KvType::Q8_0) => b(0.24, 10.5, 88), // 0.12 / 5.3 / 88
        other => panic!("no bound measured for {other:?}"),
    }
}

#[derive(Deserialize)]
struct Fixture {
    generations: Vec<FixturePrompt>,
}

#[derive(Deserialize)]
struct FixturePrompt {
    prompt_ids: Vec<u32>,
}

fn prompts(model: &str) -> Vec<Vec<u32>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/reference")
        .join(format!("{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    fixture.generations.into_iter().map(|g| g.prompt_ids).collect()
}

/// How the model's weights run.
#[derive(Clone, Copy, Debug)]
enum Weights {
    /// As `serve` runs the GGUF: quantized matmuls, which quantize activations to 8 bits.
    Served,
    /// Dequantized to f32, without activation quantization, so that the KV type's own error
    /// shows (under 8-bit activations any change at all moves logprobs by about as much).
    F32,
}

fn bundle(model: &str, weights: Weights) -> Arc<ModelBundle> {
    let path = spindle_hub::pull(model, &spindle_hub::spindle_home())
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    match weights {
        Weights::Served => Arc::new(ModelBundle::load(&ModelFiles::Gguf(path)).unwrap()),
        Weights::F32 => {
            let tokenizer =
                Tokenizer::from_gguf(spindle_chat::read_tokenizer_metadata(&path).unwrap())
                    .unwrap();
            Arc::new(ModelBundle {
                model: spindle_models::load_gguf_f32(&path).unwrap(),
                tokenizer: tokenizer.into(),
                template: ChatTemplate::chatml(),
                fingerprint: "f32".into(),
                sampling: Default::default(),
            })
        }
    }
}

/// An engine at serve's settings storing keys and values as `kind`, with room for `runs` runs
/// at once.
fn engine(bundle: &Arc<ModelBundle>, kind: KvType, runs: usize) -> Engine {
    let cache =
        CacheConfig { kv_type: kind, ..CacheConfig::default() }.holding(bundle, CONTEXT * runs);
    Engine::start(bundle.clone(), EngineConfig::new(runs, cache))
}

/// [`steps`] of every prompt, the prompts run at once (batched: a row's bits do not depend on
/// the rows beside it, so this only saves time).
fn all_steps(engine: &Engine, prompts: &[Vec<u32>], paths: &[Vec<u32>]) -> Vec<Vec<SampledToken>> {
    std::thread::scope(|scope| {
        let runs: Vec<_> = prompts
            .iter()
            .zip(paths)
            .map(|(prompt, path)| scope.spawn(move || steps(engine, prompt, path)))
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    })
}

/// The steps after `prompt`, greedy where `path` is empty, else following `path`: where the
/// engine's token differs from the path's, that request is cancelled and a new one continues
/// from the path's tokens.
fn steps(engine: &Engine, prompt: &[u32], path: &[u32]) -> Vec<SampledToken> {
    let mut out: Vec<SampledToken> = Vec::new();
    while out.len() < STEPS {
        let fed: Vec<u32> = match path {
            [] => out.iter().map(|t| t.id).collect(),
            path => path[..out.len()].to_vec(),
        };
        let sampling = SamplingParams {
            temperature: 0.0,
            top_logprobs: Some(MAX_TOP_LOGPROBS),
            ..SamplingParams::default()
        };
        let request =
            SequenceRequest::plain([prompt, &fed].concat(), STEPS - out.len(), sampling, CONTEXT);
        let (caller, mut inbox) = sequence_channel();
        let cancel = inbox.canceller();
        engine.submit(request, caller).unwrap();
        let mut diverged = false;
        loop {
            match inbox.blocking_recv().expect("the engine ends every sequence with an event") {
                SequenceEvent::Token { token, .. } if !diverged => {
                    diverged = !path.is_empty() && token.id != path[out.len()];
                    out.push(token);
                    if diverged {
                        cancel.cancel();
                    }
                }
                SequenceEvent::Finished(_) => break,
                SequenceEvent::Failed(error) => panic!("{error}"),
                _ => {}
            }
        }
    }
    out
}

/// Differences of f32's top log-probabilities under another type, and top-1 agreements.
#[derive(Default)]
struct Drift {
    differences: Vec<f32>,
    agree: usize,
    steps: usize,
}

impl Drift {
    fn add(&mut self, reference: &SampledToken, other: &SampledToken) {
        for &(id, lp) in reference.top_logprobs.iter().take(COMPARED).filter(|t| t.1 >= MIN_LOGPROB)
        {
            // A token that left the other's top 20 is at most as likely as its 20th: the
            // difference is at least the distance to that.
            let last = other.top_logprobs.last().map_or(f32::NEG_INFINITY, |t| t.1);
            let theirs = other.top_logprobs.iter().find(|t| t.0 == id).map_or(last, |t| t.1);
            self.differences.push((theirs - lp).abs());
        }
        self.agree += usize::from(other.id == reference.id);
        self.steps += 1;
    }

    fn median(&mut self) -> f32 {
        self.differences.sort_by(f32::total_cmp);
        self.differences[self.differences.len() / 2]
    }

    fn max(&self) -> f32 {
        self.differences.iter().copied().fold(0.0, f32::max)
    }
}

fn check(model: &str, weights: Weights) {
    let bundle = bundle(model, weights);
    let prompts = prompts(model);
    let reference = engine(&bundle, KvType::F32, prompts.len());
    let greedy = all_steps(&reference, &prompts, &vec![Vec::new(); prompts.len()]);
    drop(reference);
    let paths: Vec<Vec<u32>> =
        greedy.iter().map(|steps| steps.iter().map(|t| t.id).collect()).collect();
    let mut failures = Vec::new();
    for kind in [KvType::F16, KvType::Bf16, KvType::Q8_0] {
        let engine = engine(&bundle, kind, prompts.len());
        let mut drift = Drift::default();
        for (greedy, steps) in greedy.iter().zip(all_steps(&engine, &prompts, &paths)) {
            for (ours, theirs) in greedy.iter().zip(steps) {
                drift.add(ours, &theirs);
            }
        }
        let (median, max, agreement) =
            (drift.median(), drift.max(), drift.agree as f32 / drift.steps as f32);
        eprintln!(
            "| {model} | {weights:?} | {kind} | {median:.1e} | {max:.1e} | {}/{} |",
            drift.agree, drift.steps
        );
        let limit = bound(model, weights, kind);
        if median > limit.median || max > limit.max || agreement < limit.agreement {
            failures.push(format!(
                "{kind}: median {median:.2e} max {max:.2e} agreement {agreement:.3}"
            ));
        }
    }
    assert!(failures.is_empty(), "{model} drifts beyond its bounds: {failures:?}");
}

/// With f32 weights each type's own error shows; under 8-bit activations every type moves
/// logprobs about alike, which Qwen2.5's served run checks.
#[test]
fn smollm2_kv_types_stay_near_f32() {
    check("smollm2-135m", Weights::F32);
}

/// The README's served row of SmolLM2: what Qwen2.5's served run checks in every test run, for
/// the second most costly test of the crate.
#[test]
#[ignore = "the README's served row for SmolLM2: run with --ignored"]
fn smollm2_kv_types_stay_near_f32_when_served() {
    check("smollm2-135m", Weights::Served);
}

#[test]
fn qwen25_coder_kv_types_stay_near_f32() {
    check("qwen2.5-coder-0.5b", Weights::Served);
}

/// The README's row of Qwen2.5 with f32 weights: each type's own error, which smollm2's f32 run
/// checks in every test run; here 2 GB of f32 weights read per step made it the slowest test
/// of all (~45 s of a quiet 2-core machine), for the same q8_0 outliers the served run shows.
#[test]
#[ignore = "the README's f32-weights row for Qwen2.5: run with --ignored"]
fn qwen25_coder_kv_types_stay_near_f32_with_f32_weights() {
    check("qwen2.5-coder-0.5b", Weights::F32);
}
