//! A draft model changes no byte: SmolLM2 drafting for itself has every greedy draft accepted,
//! a random-weight model of SmolLM2's vocabulary has few accepted, and either way every
//! request's tokens, logprobs, text and finish are those of the same request decoded plainly,
//! greedy or seeded, alone or batched with plain sequences. A draft whose vocabulary is not the
//! target's is refused, naming both. Preempted sequences give their blocks back to the draft's
//! pool and still answer as alone.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use spindle_models::random_dense::{write_random_dense, DenseShape};
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{
    CacheConfig, DraftModel, Engine, EngineConfig, SequenceRequest, SpeculationConfig,
};

use crate::common::{
    collect_summary as collect, greedy, hybrid, request, seeded, smollm2, smollm2_files,
    tiny_dense, vocab, BLOCK_SIZE,
};
use crate::speculation::{assert_same, encode, on_request, run, spec_cache, start_with, submit};

const CONTEXT: usize = 1024;

const PROSE: &str = "The lighthouse keeper wrote in his log every evening. He noted the wind, \
    the colour of the sea, and the ships that passed. One winter night";

const CODE: &str = "def area(width, height):\n    return width * height\n\n\
    def perimeter(width, height):\n    return 2 * (width + height)\n\n\
    def area(";

/// SmolLM2 loaded a second time, as its own draft.
fn smollm2_draft() -> Arc<DraftModel> {
    static DRAFT: OnceLock<Arc<DraftModel>> = OnceLock::new();
    DRAFT
        .get_or_init(|| {
            let load = DraftModel::load(&smollm2_files(), "smollm2", &smollm2(), "smollm2");
            Arc::new(load.unwrap())
        })
        .clone()
}

/// A two-layer random model over SmolLM2's 49,152 ids: its drafts are seldom right.
fn random_draft() -> Arc<DraftModel> {
    static DRAFT: OnceLock<Arc<DraftModel>> = OnceLock::new();
    DRAFT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let shape = DenseShape::tiny(smollm2().tokenizer.vocab_size());
            write_random_dense(dir.path(), &shape, 5, &[]).unwrap();
            let model = spindle_models::load_safetensors(dir.path()).unwrap();
            Arc::new(DraftModel::new(model, "random").unwrap())
        })
        .clone()
}

/// An engine over SmolLM2 drafting with `draft` (and the lookup first, if `lookup`), its KV
/// memory shared with the draft as `spindle serve` shares it.
fn start(draft: &Arc<DraftModel>, max_active: usize, lookup: bool) -> Engine {
    let bundle = smollm2();
    let mut cache = spec_cache();
    draft.share_kv_memory(&mut cache, &bundle).unwrap();
    let speculation =
        SpeculationConfig { draft_model: Some(draft.clone()), lookup, ..on_request() };
    start_with(&bundle, max_active, cache, speculation)
}

fn spec_request(prompt: &[u32], sampling: SamplingParams, speculative: bool) -> SequenceRequest {
    SequenceRequest { sampling, speculative: Some(speculative), ..request(prompt, 40, CONTEXT) }
}

#[test]
fn smollm2_drafting_for_itself_has_every_greedy_draft_accepted() {
    let engine = start(&smollm2_draft(), 1, false);
    let prompt = encode(&smollm2(), PROSE);
    let plain = run(&engine, spec_request(&prompt, greedy(), false));
    let spec = run(&engine, spec_request(&prompt, greedy(), true));
    assert_same(&spec, &plain, "greedy");
    // Only the round that reaches max_tokens may leave its last draft undecided.
    let (drafted, accepted) = (spec.1.drafted_tokens, spec.1.accepted_tokens);
    assert!(accepted >= 24 && drafted - accepted <= 1, "{:?}", spec.1);
    // A seeded draw is not the draft's greedy pick: fewer accepted, the same bytes.
    let plain = run(&engine, spec_request(&prompt, seeded(), false));
    let spec = run(&engine, spec_request(&prompt, seeded(), true));
    assert_same(&spec, &plain, "seeded");
    assert!(spec.1.drafted_tokens > 0, "{:?}", spec.1);
    let load = engine.load();
    let counted = load.spec_draft_tokens.load(Ordering::Relaxed);
    assert_eq!(counted, drafted + spec.1.drafted_tokens, "/metrics counts the model's drafts");
}

#[test]
fn a_random_draft_model_is_seldom_right_and_changes_no_byte() {
    let prompt = encode(&smollm2(), PROSE);
    for lookup in [false, true] {
        let engine = start(&random_draft(), 1, lookup);
        for (name, sampling) in [("greedy", greedy()), ("seeded", seeded())] {
            let what = format!("{name}, lookup {lookup}");
            let plain = run(&engine, spec_request(&prompt, sampling.clone(), false));
            let spec = run(&engine, spec_request(&prompt, sampling, true));
            assert_same(&spec, &plain, &what);
            // With the lookup on, the plain run's output drafts the speculative one (as a
            // retry's): only the draft model alone shows its own acceptance.
            if !lookup {
                let (drafted, accepted) = (spec.1.drafted_tokens, spec.1.accepted_tokens);
                assert!(drafted > 2 * accepted, "{what}: {:?}", spec.1);
            }
        }
    }
}

#[test]
fn draft_model_and_plain_sequences_batched_together_change_no_byte() {
    let bundle = smollm2();
    let prompts = [CODE, PROSE, PROSE].map(|text| encode(&bundle, text));
    let samplings = [greedy(), seeded(), SamplingParams { seed: Some(3), ..seeded() }];
    for draft in [smollm2_draft(), random_draft()] {
        let alone = start(&draft, 1, true);
        let together = start(&draft, 3, true);
        let inboxes: Vec<_> = (prompts.iter().zip(&samplings).enumerate())
            .map(|(i, (p, s))| submit(&together, spec_request(p, s.clone(), i != 1)))
            .collect();
        for (i, inbox) in inboxes.into_iter().enumerate() {
            let batched = collect(inbox);
            let plain = run(&alone, spec_request(&prompts[i], samplings[i].clone(), false));
            let what = format!("{}: sequence {i} of 3", draft.name);
            assert_same(&batched, &plain, &what);
            assert_eq!(batched.1.drafted_tokens > 0, i != 1, "{what}: {:?}", batched.1);
        }
    }
}

/// An engine over the tiny random model, speculating by default with a random draft of its
/// vocabulary alone (the same shape, so its pool holds as many blocks), over `blocks` blocks
/// each.
fn tiny_engine(blocks: usize, speculate: bool) -> Engine {
    let bundle = tiny_dense();
    let dir = tempfile::tempdir().unwrap();
    let shape = DenseShape::tiny(vocab(&bundle) as usize);
    write_random_dense(dir.path(), &shape, 11, &[]).unwrap();
    let draft = DraftModel::new(spindle_models::load_safetensors(dir.path()).unwrap(), "random");
    let draft = draft.unwrap();
    let block_bytes =
        CacheConfig { block_size: BLOCK_SIZE, ..CacheConfig::default() }.block_bytes(&bundle);
    let mut cache = CacheConfig {
        kv_bytes: 2 * blocks * block_bytes,
        block_size: BLOCK_SIZE,
        ..CacheConfig::default()
    };
    draft.share_kv_memory(&mut cache, &bundle).unwrap();
    assert_eq!(cache.kv_blocks(&bundle), blocks);
    let speculation = SpeculationConfig {
        by_default: speculate,
        draft_model: Some(Arc::new(draft)),
        // The draft model alone: the burst's outputs would draft the requests after it.
        lookup: false,
        ..SpeculationConfig::default()
    };
    let config = EngineConfig { speculation, ..EngineConfig::new(6, cache) };
    Engine::start(bundle, config)
}

#[test]
fn sequences_preempted_while_the_draft_model_drafts_give_their_outputs_alone() {
    const BURST_CONTEXT: usize = 160;
    let ids = vocab(&tiny_dense());
    let prompt = |i: usize| -> Vec<u32> {
        (0..72 + 6 * i as u32).map(|p| (p * 13 + i as u32 * 71 + 3) % (ids - 2) + 1).collect()
    };
    let burst = |engine: &Engine| {
        let inboxes: Vec<_> = (0..6)
            .map(|i| {
                let sampling = if i % 2 == 0 { greedy() } else { seeded() };
                let p = prompt(i);
                let max_tokens = BURST_CONTEXT - p.len();
                submit(
                    engine,
                    SequenceRequest { sampling, ..request(&p, max_tokens, BURST_CONTEXT) },
                )
            })
            .collect();
        // A reader per request, as a server has: all outgrow the pool together.
        std::thread::scope(|scope| {
            let readers: Vec<_> =
                inboxes.into_iter().map(|inbox| scope.spawn(move || collect(inbox))).collect();
            readers.into_iter().map(|reader| reader.join().unwrap()).collect::<Vec<_>>()
        })
    };
    // Room for the longest request alone, and about two and a half in all.
    let tight =
        tiny_engine(2 * BURST_CONTEXT / BLOCK_SIZE + BURST_CONTEXT / (2 * BLOCK_SIZE), true);
    let outputs = burst(&tight);
    let load = tight.load();
    assert!(load.preemptions.load(Ordering::Relaxed) > 0, "the burst outgrew the pool");
    assert!(load.spec_draft_tokens.load(Ordering::Relaxed) > 0, "the draft model drafted");
    // Every draft block came back: requests after the burst, one after another, each draft
    // (a pool that lost an ended sequence's blocks runs dry within a few).
    for i in 0..6 {
        let after = run(&tight, request(&prompt(i), 24, BURST_CONTEXT));
        assert!(after.1.drafted_tokens > 0, "request {i} after the burst: {:?}", after.1);
    }
    let plain = burst(&tiny_engine(6 * BURST_CONTEXT / BLOCK_SIZE, false));
    for (i, (output, alone)) in outputs.iter().zip(&plain).enumerate() {
        assert_same(output, alone, &format!("request {i}"));
    }
}

#[test]
fn a_hybrid_model_checks_the_draft_model_s_drafts_without_changing_a_byte() {
    let bundle = hybrid();
    let dir = tempfile::tempdir().unwrap();
    write_random_dense(dir.path(), &DenseShape::tiny(vocab(&bundle) as usize), 13, &[]).unwrap();
    let draft = DraftModel::new(spindle_models::load_safetensors(dir.path()).unwrap(), "random");
    let draft = Arc::new(draft.unwrap());
    let mut cache = CacheConfig { block_size: BLOCK_SIZE, ..CacheConfig::default() };
    draft.share_kv_memory(&mut cache, &bundle).unwrap();
    let speculation = SpeculationConfig {
        by_default: false,
        draft_model: Some(draft),
        lookup: false,
        ..SpeculationConfig::default()
    };
    let engine = Engine::start(bundle, EngineConfig { speculation, ..EngineConfig::new(2, cache) });
    let prompt: Vec<u32> = (0..40).map(|i| 10 + i % 7).collect();
    for (name, sampling) in [("greedy", greedy()), ("seeded", seeded())] {
        let plain = run(&engine, spec_request(&prompt, sampling.clone(), false));
        let spec = run(&engine, spec_request(&prompt, sampling, true));
        assert_same(&spec, &plain, name);
        assert!(spec.1.drafted_tokens > 0, "{name}: {:?}", spec.1);
    }
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_naming_both() {
    let gemma = spindle_hub::resolve(
        "gemma3-270m",
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )
    .unwrap();
    let error = DraftModel::load(&gemma, "gemma3-270m", &smollm2(), "smollm2-135m").unwrap_err();
    let message = error.to_string();
    assert!(message.contains("gemma3-270m") && message.contains("smollm2-135m"), "{message}");
    assert!(message.contains("vocabularies differ"), "{message}");
}
