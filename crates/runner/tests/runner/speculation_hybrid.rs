//! Speculative decoding on the tiny random hybrid (Gated DeltaNet, gated attention, MoE)
//! changes no byte either: its recurrent layers check drafts token by token and go back to the
//! last accepted one. Lookup drafts and drafts with a wrong token planted at each position of
//! the window, greedy and seeded, alone and batched with plain sequences and with prompts being
//! read, and the prefix cache those runs leave behind serves later requests bit for bit.

use spindle_runner::sampler::SamplingParams;
use spindle_runner::SequenceRequest;

use crate::common::{collect_summary as collect, greedy, hybrid, seeded};
use crate::speculation::{assert_same, planted_script, run, spec_request, start, submit};

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
