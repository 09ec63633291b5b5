//! Engine-level helpers shared by the prefix-cache test files: the tiny random dense model
//! (written on first use), the real default model (SmolLM2-135M, pulled on first use), the tiny
//! hybrid fixture, a small engine, and one request run to its end with its output as bits.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use spindle_hub::ModelFiles;
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{
    model_fingerprint, sequence_channel, CacheConfig, DiskConfig, Engine, EngineConfig,
    ModelBundle, SequenceEvent, SequenceEvents, SequenceRequest, SequenceSummary,
};

/// Small enough that short prompts span several chunks and blocks.
pub const PREFILL_CHUNK: usize = 32;
pub const BLOCK_SIZE: usize = 16;

pub fn smollm2_files() -> ModelFiles {
    spindle_hub::resolve(
        "smollm2-135m",
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The tiny random dense model of `spindle_testkit` (two layers of width 32, Qwen3's
/// tokenizer): the engine's cache and scheduling properties at a few milliseconds a step.
pub fn tiny_dense() -> Arc<ModelBundle> {
    static BUNDLE: OnceLock<Arc<ModelBundle>> = OnceLock::new();
    BUNDLE
        .get_or_init(|| Arc::new(ModelBundle::load(&spindle_testkit::tiny_model()).unwrap()))
        .clone()
}

/// The vocabulary of `bundle`'s model, the bound of the random prompts.
pub fn vocab(bundle: &ModelBundle) -> u32 {
    bundle.model.config().vocab_size as u32
}

pub fn smollm2() -> Arc<ModelBundle> {
    static BUNDLE: OnceLock<Arc<ModelBundle>> = OnceLock::new();
    BUNDLE.get_or_init(|| Arc::new(ModelBundle::load(&smollm2_files()).unwrap())).clone()
}

/// The tiny Qwen3.5-MoE hybrid (vocabulary of 512) with SmolLM2's tokenizer to print its ids.
pub fn hybrid() -> Arc<ModelBundle> {
    static BUNDLE: OnceLock<Arc<ModelBundle>> = OnceLock::new();
    BUNDLE
        .get_or_init(|| {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/data/hybrid/qwen3_5_moe");
            let model = spindle_models::load_safetensors(&dir).unwrap();
            let ModelBundle { tokenizer, template, sampling, .. } =
                ModelBundle::load(&smollm2_files()).unwrap();
            let fingerprint = model_fingerprint(&ModelFiles::Safetensors { dir }).unwrap();
            Arc::new(ModelBundle { model, tokenizer, template, fingerprint, sampling })
        })
        .clone()
}

pub fn engine(bundle: &Arc<ModelBundle>, disk: Option<&Path>) -> Engine {
    engine_with_orphans(bundle, disk, usize::MAX)
}

/// [`engine`] reading at most `orphan_prefill_tokens` of a dropped prompt while idle (0: none).
pub fn engine_with_orphans(
    bundle: &Arc<ModelBundle>,
    disk: Option<&Path>,
    orphan_prefill_tokens: usize,
) -> Engine {
    let cache = CacheConfig {
        kv_bytes: 64 << 20,
        snapshot_bytes: 64 << 20,
        block_size: BLOCK_SIZE,
        disk: disk.map(|dir| DiskConfig { dir: dir.to_path_buf(), bytes: 1 << 30 }),
        ..CacheConfig::default()
    };
    let config = EngineConfig {
        max_active: 2,
        prefill_chunk: PREFILL_CHUNK,
        step_tokens: 2 * PREFILL_CHUNK,
        cache,
        orphan_prefill_tokens,
        fault_injection: None,
        speculation: Default::default(),
    };
    Engine::start(bundle.clone(), config)
}

pub fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, top_logprobs: Some(3), ..SamplingParams::default() }
}

pub fn seeded() -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        seed: Some(7),
        top_logprobs: Some(3),
        ..SamplingParams::default()
    }
}

/// What a client sees of a generation, floats as bits so equality means identical bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub tokens: Vec<Token>,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub id: u32,
    pub logprob: u32,
    pub top_logprobs: Vec<(u32, u32)>,
}

/// A greedy request for `prompt` with no stops, snapshots or reasoning: tests override the rest
/// with struct-update syntax.
pub fn request(prompt: &[u32], max_tokens: usize, context: usize) -> SequenceRequest {
    SequenceRequest::plain(prompt.to_vec(), max_tokens, greedy(), context)
}

/// Runs one request to the end; the output and the prompt positions taken from the cache.
pub fn run(
    engine: &Engine,
    prompt: &[u32],
    snapshots: &[usize],
    sampling: SamplingParams,
    context: usize,
) -> (Output, usize) {
    collect(submit(engine, prompt, snapshots, sampling, context))
}

/// Queues one request; its events arrive on the returned inbox.
pub fn submit(
    engine: &Engine,
    prompt: &[u32],
    snapshots: &[usize],
    sampling: SamplingParams,
    context: usize,
) -> SequenceEvents {
    let (caller, inbox) = sequence_channel();
    engine
        .submit(
            SequenceRequest {
                snapshot_positions: snapshots.to_vec(),
                sampling,
                ..request(prompt, 12, context)
            },
            caller,
        )
        .unwrap();
    inbox
}

/// Reads a submitted request's events to its end; the output and the cached prompt positions.
pub fn collect(inbox: SequenceEvents) -> (Output, usize) {
    let (output, summary) = collect_summary(inbox);
    (output, summary.cached_tokens)
}

/// Reads a submitted request's events to its end; the output and the summary it ended with.
pub fn collect_summary(mut inbox: SequenceEvents) -> (Output, SequenceSummary) {
    let mut output = Output { tokens: Vec::new(), text: String::new() };
    loop {
        match inbox.blocking_recv().expect("the engine ends every sequence with an event") {
            SequenceEvent::Token { token, text, .. } => {
                let top_logprobs =
                    token.top_logprobs.iter().map(|&(id, lp)| (id, lp.to_bits())).collect();
                output.tokens.push(Token {
                    id: token.id,
                    logprob: token.logprob.to_bits(),
                    top_logprobs,
                });
                output.text += &text.content;
            }
            SequenceEvent::Finished(summary) => {
                output.text += &summary.tail.content;
                assert_eq!(summary.completion_tokens, output.tokens.len());
                return (output, summary);
            }
            SequenceEvent::Prefilled { .. } => {}
            SequenceEvent::Failed(message) => panic!("the sequence failed: {message}"),
        }
    }
}
