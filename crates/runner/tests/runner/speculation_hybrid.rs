//! Speculative decoding on the tiny random hybrid (Gated DeltaNet, gated attention, MoE)
//! changes no byte either: its recurrent layers check drafts token by token and go back to the
//! last accepted one. Lookup drafts and drafts with a wrong token planted at each position of
//! the window, greedy and seeded, alone and batched with plain sequences and with prompts being
//! read, and the prefix cache those runs leave behind serves later requests bit for bit.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use spindle_models::random_hybrid::{placeholder_tokenizer, write_random_hybrid, HybridShape};
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{
    share_rollback_memory, CacheConfig, DraftScript, Engine, ModelBundle, SequenceRequest,
    SpeculationConfig,
};

use crate::common::{
    collect_summary as collect, greedy, hybrid, seeded, smollm2_files, tiny_dense,
};
use crate::speculation::{
    assert_same, on_request, planted_script, run, spec_cache, spec_request, start, start_with,
    submit,
};

/// The hybrid fixture's vocabulary.
const VOCAB: u32 = 512;

/// Ids below the vocabulary that repeat with period `period`, so the lookup finds drafts.
fn repeating(len: usize, period: u32, offset: u32) -> Vec<u32> {
    (0..len as u32).map(|i| offset + (i * 37) % period).collect()
}

fn samplings() -> [(&'static str, SamplingParams); 4] {
    [
        ("greedy", greedy()),
        ("seed 7", seeded()),
        ("seed 3", SamplingParams { seed: Some(3), ..seeded() }),
        ("seed 11, top_p", SamplingParams { seed: Some(11), top_p: 0.9, ..seeded() }),
    ]
}

#[test]
fn lookup_drafts_change_no_byte_on_a_hybrid_model() {
    let bundle = hybrid();
    let engine = start(&bundle, 2, None);
    let prompt = repeating(60, 11, 20);
    for (name, sampling) in samplings() {
        // Plain first: its output is what the speculating run drafts from (a retry, an agent's
        // repeated call), as a random model does not repeat its prompt.
        let plain = run(&engine, spec_request(&prompt, sampling.clone(), 32, false));
        let spec = run(&engine, spec_request(&prompt, sampling, 32, true));
        assert_same(&spec, &plain, name);
        assert!(spec.1.accepted_tokens > 0, "{name}: {:?}", spec.1);
    }
}

#[test]
fn a_draft_rejected_at_each_position_changes_no_byte_on_a_hybrid_model() {
    let bundle = hybrid();
    let plain_engine = start(&bundle, 1, None);
    let prompt = repeating(45, 13, 100);
    for (name, sampling) in samplings() {
        let plain = run(&plain_engine, spec_request(&prompt, sampling.clone(), 48, false));
        let truth: Vec<u32> = plain.0.tokens.iter().map(|t| t.id).collect();
        let script = planted_script(vec![(prompt.clone(), truth.clone())], VOCAB);
        let spec = run(&start(&bundle, 1, Some(script)), spec_request(&prompt, sampling, 48, true));
        assert_same(&spec, &plain, name);
        let (drafted, accepted) = (spec.1.drafted_tokens, spec.1.accepted_tokens);
        assert!(accepted > 0 && accepted < drafted, "{name}: {accepted} of {drafted}");
    }
}

/// Three requests at once, two speculating with planted drafts and one plain, while a fourth
/// prompt is read in chunks beside their verification rounds; then requests resuming from the
/// prefix cache those runs filled (the fourth prompt's snapshots, and a first request's prompt
/// with its reply and more after it) speculate too. Each output is the one a plain engine gives
/// cold.
#[test]
fn batched_and_cached_hybrid_runs_speculate_without_changing_a_byte() {
    let bundle = hybrid();
    let plain_engine = start(&bundle, 1, None);
    let prompts = [repeating(40, 11, 30), repeating(50, 17, 200), repeating(35, 7, 400)];
    let samplings = [greedy(), seeded(), SamplingParams { seed: Some(5), ..seeded() }];
    let plain: Vec<_> = prompts
        .iter()
        .zip(&samplings)
        .map(|(p, s)| run(&plain_engine, spec_request(p, s.clone(), 40, false)))
        .collect();
    let truths = prompts
        .iter()
        .zip(&plain)
        .map(|(p, out)| (p.clone(), out.0.tokens.iter().map(|t| t.id).collect()))
        .collect();
    let engine = start(&bundle, 4, Some(planted_script(truths, VOCAB)));
    let inboxes: Vec<_> = prompts
        .iter()
        .zip(&samplings)
        .enumerate()
        .map(|(i, (p, s))| submit(&engine, spec_request(p, s.clone(), 40, i != 1)))
        .collect();
    // Read beside the rounds: snapshots at its message ends and its end.
    let long: Vec<u32> = repeating(300, 97, 5);
    let long_request = |speculative| SequenceRequest {
        snapshot_positions: vec![100, 200, 300],
        ..spec_request(&long, greedy(), 8, speculative)
    };
    let long_inbox = submit(&engine, long_request(true));
    for (i, inbox) in inboxes.into_iter().enumerate() {
        let batched = collect(inbox);
        assert_same(&batched, &plain[i], &format!("sequence {i} of 3"));
        if i != 1 {
            assert!(batched.1.drafted_tokens > batched.1.accepted_tokens, "{:?}", batched.1);
        }
    }
    let long_plain = run(&start(&bundle, 1, None), long_request(false));
    assert_same(&collect(long_inbox), &long_plain, "the prompt read beside the rounds");

    // From the cache: the long prompt's middle snapshot, and the first prompt's end.
    let mut resumed_long = long[..200].to_vec();
    resumed_long.extend(repeating(30, 5, 450));
    let mut next_turn = prompts[0].clone();
    next_turn.extend(plain[0].0.tokens.iter().map(|t| t.id));
    next_turn.extend(repeating(20, 3, 60));
    for (name, prompt, snapshots) in [
        ("the long prompt's snapshot", resumed_long, vec![100, 200]),
        ("the first prompt's end", next_turn, vec![prompts[0].len()]),
    ] {
        let request = |speculative| SequenceRequest {
            snapshot_positions: snapshots.clone(),
            ..spec_request(&prompt, seeded(), 24, speculative)
        };
        let cold = run(&start(&bundle, 1, None), request(false));
        let cached = run(&engine, request(true));
        assert_same(&cached, &cold, name);
        assert!(cached.1.cached_tokens > 0, "{name}: nothing came from the cache");
    }
}

/// The states the recurrent layers keep for drafted positions come out of the KV memory
/// (`share_rollback_memory`): with room for 5, two sequences whose scripts would draft 8 right
/// tokens a round share them (each keeps what it took until it ends) and never draft a sixth;
/// outputs are the plain ones. Without a share, the same runs draft 8.
#[test]
fn hybrid_drafts_stay_within_the_states_their_share_holds() {
    let bundle = hybrid();
    let plain_engine = start(&bundle, 1, None);
    let prompts = [repeating(40, 11, 30), repeating(50, 17, 200)];
    let lengths = [20, 48];
    let plain: Vec<_> = (prompts.iter().zip(lengths))
        .map(|(p, n)| run(&plain_engine, spec_request(p, greedy(), n, false)))
        .collect();
    let truths: Vec<(Vec<u32>, Vec<u32>)> = (prompts.iter().zip(&plain))
        .map(|(p, out)| (p.clone(), out.0.tokens.iter().map(|t| t.id).collect()))
        .collect();
    let right_drafts = DraftScript(Arc::new(move |history: &[u32], room: usize| {
        let Some((prompt, truth)) = truths.iter().find(|(p, _)| history.starts_with(p)) else {
            return Vec::new();
        };
        truth.iter().skip(history.len() - prompt.len()).take(room).copied().collect()
    }));
    let position_bytes = bundle.model.initial_recurrent_state().bytes();
    let deepest_accepted = |rollback_bytes: Option<usize>| {
        let cache = CacheConfig { rollback_bytes, ..spec_cache() };
        let speculation = SpeculationConfig { script: Some(right_drafts.clone()), ..on_request() };
        let engine = start_with(&bundle, 2, cache, speculation);
        let inboxes: Vec<_> = (prompts.iter().zip(lengths))
            .map(|(p, n)| submit(&engine, spec_request(p, greedy(), n, true)))
            .collect();
        for (i, inbox) in inboxes.into_iter().enumerate() {
            let spec = collect(inbox);
            assert_same(&spec, &plain[i], &format!("sequence {i}, share {rollback_bytes:?}"));
            assert!(spec.1.accepted_tokens > 0, "sequence {i} never drafted: {:?}", spec.1);
        }
        let by_position = &engine.load().spec_accepted_by_position;
        by_position.iter().rposition(|n| n.load(Ordering::Relaxed) > 0).map_or(0, |p| p + 1)
    };
    assert_eq!(deepest_accepted(Some(5 * position_bytes)), 5);
    assert_eq!(deepest_accepted(None), 8, "uncounted, the scripts draft their most");
}

/// The share comes out of the KV memory: enough for every sequence's longest round, at most an
/// eighth, the pool keeping whole blocks; nothing for a model without recurrent layers or with
/// speculation off.
#[test]
fn the_rollback_share_is_taken_from_the_kv_memory() {
    let bundle = hybrid();
    let position_bytes = bundle.model.initial_recurrent_state().bytes();
    let block_bytes = spec_cache().block_bytes(&bundle);
    let shared = |kv_bytes: usize, max_active: usize, speculation: &SpeculationConfig| {
        let mut cache = CacheConfig { kv_bytes, ..spec_cache() };
        let share = share_rollback_memory(&bundle, &mut cache, max_active, speculation);
        (share, cache)
    };
    let roomy = 1000 * position_bytes;
    let (share, cache) = shared(roomy, 4, &on_request());
    let share = share.unwrap();
    assert_eq!((share.positions, share.position_bytes), (4 * 8, position_bytes));
    assert_eq!(cache.rollback_bytes, Some(32 * position_bytes));
    assert!(cache.kv_bytes + share.bytes() <= roomy, "more than the budget");
    assert!(roomy - share.bytes() - cache.kv_bytes < block_bytes, "a whole block left out");
    assert_eq!(cache.kv_bytes % block_bytes, 0);
    let (tight, _) = shared(16 * position_bytes, 4, &on_request());
    assert_eq!(tight.unwrap().positions, 2, "an eighth of the KV memory at most");
    let off = SpeculationConfig { max_draft: 0, ..on_request() };
    assert_eq!(shared(roomy, 4, &off).0, None);
    let mut cache = spec_cache();
    assert_eq!(share_rollback_memory(&tiny_dense(), &mut cache, 4, &on_request()), None);
    assert_eq!((cache.kv_bytes, cache.rollback_bytes), (spec_cache().kv_bytes, None));
}

/// Decode speed with and without speculation on the random Qwen3.5-MoE shape of the agent
/// benchmark (hidden 1024, 64 experts top-8, 2 blocks, SmolLM2's tokenizer), alternated rounds:
/// a request whose drafts are all right (a retry: the lookup drafts the earlier output) and a
/// fresh one, where a random model offers the lookup almost nothing to draft. A
/// measurement, printed and run by hand; it checks only that the outputs are the plain ones.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn print_speculation_speed_on_a_hybrid_moe_shape() {
    let shape = HybridShape::AGENT_BAR;
    let path = std::env::temp_dir().join(shape.file_name(2));
    if !path.exists() {
        let partial = path.with_extension("partial");
        let mut file = std::fs::File::create(&partial).unwrap();
        write_random_hybrid(&mut file, &shape, 2, placeholder_tokenizer(49_152)).unwrap();
        std::fs::rename(&partial, &path).unwrap();
    }
    let model = spindle_models::load_gguf(&path).unwrap();
    let ModelBundle { tokenizer, template, sampling, fingerprint, .. } =
        ModelBundle::load(&smollm2_files()).unwrap();
    let bundle = Arc::new(ModelBundle { model, tokenizer, template, fingerprint, sampling });
    let tokens = 96;
    let timed = |engine: &Engine, prompt: &[u32], speculative: bool| {
        let started = Instant::now();
        let out = run(engine, spec_request(prompt, greedy(), tokens, speculative));
        (tokens as f64 / started.elapsed().as_secs_f64(), out)
    };
    let engine = || start_with(&bundle, 1, spec_cache(), on_request());
    let (mut retry, mut fresh) = (Vec::new(), Vec::new());
    for round in 0..3u32 {
        // A retry: an untimed first answer, then plain and speculating repeats that both find
        // the prompt cached (the speculating one drafts the first answer).
        let warm = engine();
        let prompt = repeating(16, 4093, 1000 + 97 * round);
        run(&warm, spec_request(&prompt, greedy(), tokens, false));
        let (plain_speed, plain) = timed(&warm, &prompt, false);
        let (spec_speed, spec) = timed(&warm, &prompt, true);
        assert_same(&spec, &plain, "retry");
        retry.push((spec_speed / plain_speed, spec.1.accepted_tokens, spec.1.drafted_tokens));
        // A fresh request, cold on an engine of its own each way, in alternating order (a
        // process's first engines run beside the earlier ones' idle workers).
        drop(warm);
        let other = repeating(16, 4091, 20_000 + 89 * round);
        let [(spec_speed, spec), (plain_speed, plain)] = if round % 2 == 0 {
            [timed(&engine(), &other, true), timed(&engine(), &other, false)]
        } else {
            let plain = timed(&engine(), &other, false);
            [timed(&engine(), &other, true), plain]
        };
        assert_same(&spec, &plain, "fresh");
        fresh.push((spec_speed / plain_speed, spec.1.accepted_tokens, spec.1.drafted_tokens));
    }
    eprintln!("{} (speculation on / off, accepted of drafted):", shape.file_name(2));
    eprintln!("  retry (drafts right): {retry:.2?}");
    eprintln!("  fresh (little to draft): {fresh:.2?}");
}
