//! Teacher-forced comparison of a model with a recorded run of a catalogue model: Hugging Face
//! transformers' float32 run of the catalogue GGUF (tests/data/reference/transformers/<model>.json,
//! made by scripts/reference/make_transformers_fixtures.py), or one recorded here from another
//! of our load paths. Shared by the tests that load the same weights different ways.

pub mod gguf_rewrite;

use std::cmp::Ordering;
use std::path::PathBuf;

use serde::Deserialize;
use spindle_models::{BatchEntry, CausalLm};

/// A recorded run: per prompt, the tokens fed back in and the recorder's view at each step.
#[derive(Deserialize)]
pub struct Reference {
    model: String,
    gguf_file: String,
    /// Who recorded it, and how (the first clause names it in messages).
    reference: String,
    generations: Vec<Generation>,
}

#[derive(Deserialize)]
struct Generation {
    prompt: String,
    prompt_ids: Vec<u32>,
    /// The tokens fed back in, one per step: transformers' greedy choices.
    greedy_ids: Vec<u32>,
    /// Per step, the recorder's top-5 `[id, logprob]`, best first.
    top_logprobs: Vec<Vec<(u32, f64)>>,
    /// Per step, the recorder's margin between its top-1 and top-2 (nats).
    top2_gap: Vec<f64>,
}

/// How far a run may stray from a reference.
#[derive(Clone, Copy)]
pub struct Tolerance {
    /// Largest difference allowed in the log-probability of any of the reference's top-5 tokens.
    pub logprob: f64,
    /// Our top-1 may differ from the reference's only where the reference's own top-1/top-2
    /// margin is at most this many nats.
    pub near_tie: f64,
}

/// The very weights the reference ran, in float32: summation-order noise only. Measured
/// (2026-11-23, 480 values per model): at most 7.2e-5 (smollm2), 5.7e-5 (qwen2.5), 5.5e-5
/// (gemma3) from `load_gguf_f32`, 3.4e-5 from F32 HF checkpoints and F32 GGUF files. The
/// smallest top-1/top-2 margin in the fixtures is 5e-3, so no flip is allowed.
pub const SAME_WEIGHTS: Tolerance = Tolerance { logprob: 1e-3, near_tie: 0.0 };

/// Those weights rounded to F16 (11 significant bits), computed in f32. Measured (2026-11-23,
/// 96 steps per model): at most 1.5e-2 (smollm2), 7.8e-3 (qwen2.5), 1.2e-2 (gemma3), no top-1
/// change. `near_tie` is twice the largest shift: the top two can swap only within it.
pub const F16_WEIGHTS: Tolerance = Tolerance { logprob: 0.05, near_tie: 0.03 };

/// Rounded to BF16 (8 significant bits). Measured likewise: at most 5.5e-2 (smollm2), 6.3e-2
/// (qwen2.5), 8.1e-2 (gemma3); one top-1 change, at smollm2's margin of 0.005.
pub const BF16_WEIGHTS: Tolerance = Tolerance { logprob: 0.25, near_tie: 0.16 };

impl Reference {
    /// transformers' run of catalogue model `name`, and the GGUF it ran (pulled on first use).
    pub fn transformers(name: &str) -> (Self, PathBuf) {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/reference/transformers");
        let text = std::fs::read_to_string(root.join(format!("{name}.json"))).unwrap();
        let reference: Self = serde_json::from_str(&text).unwrap();
        assert_eq!(reference.model, name);
        assert!(reference.generations.len() >= 3);
        assert!(reference.generations.iter().all(|g| g.greedy_ids.len() == 24));
        // Tests of one binary share the lock so a model is fetched once.
        static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let gguf = {
            let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
            spindle_hub::pull(name, &spindle_hub::spindle_home())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        assert!(gguf.ends_with(&reference.gguf_file), "{}", gguf.display());
        (reference, gguf)
    }

    /// Only the first `steps` steps of the first `prompts` prompts.
    pub fn shortened(mut self, prompts: usize, steps: usize) -> Self {
        self.generations.truncate(prompts);
        for g in &mut self.generations {
            g.greedy_ids.truncate(steps);
            g.top_logprobs.truncate(steps);
            g.top2_gap.truncate(steps);
        }
        self
    }

    /// The same prompts and tokens fed back in, with `model`'s own predictions recorded as the
    /// reference (`by` names it).
    pub fn recorded(&self, model: &dyn CausalLm, by: &str) -> Self {
        let forced = teacher_force(model, &self.generations);
        let generations = self.generations.iter().zip(forced).map(|(g, steps)| {
            let top_logprobs: Vec<_> = steps.iter().map(|logprobs| top5(logprobs)).collect();
            Generation {
                prompt: g.prompt.clone(),
                prompt_ids: g.prompt_ids.clone(),
                greedy_ids: g.greedy_ids.clone(),
                top2_gap: top_logprobs.iter().map(|top| top[0].1 - top[1].1).collect(),
                top_logprobs,
            }
        });
        Self {
            model: self.model.clone(),
            gguf_file: self.gguf_file.clone(),
            reference: by.to_string(),
            generations: generations.collect(),
        }
    }

    /// Teacher-forces `model` and panics at the first step outside `tol`. Prints what it
    /// measured (`--nocapture`), labelled `what`.
    pub fn assert_followed_by(&self, model: &dyn CausalLm, what: &str, tol: Tolerance) {
        let by = self.reference.split(',').next().unwrap();
        let (mut steps, mut worst, mut flips, mut widest_flip) = (0, 0f64, 0, 0f64);
        for (g, forced) in self.generations.iter().zip(teacher_force(model, &self.generations)) {
            for (step, ours) in forced.iter().enumerate() {
                let at =
                    format!("{}: {what} vs {by}: prompt {:?} step {step}", self.model, g.prompt);
                let (expected, gap) = (g.top_logprobs[step][0].0, g.top2_gap[step]);
                let top1 = argmax(ours);
                if top1 != expected {
                    assert!(
                        gap <= tol.near_tie,
                        "{at}: top-1 {top1} instead of {expected}, whose margin is {gap}"
                    );
                    flips += 1;
                    widest_flip = widest_flip.max(gap);
                }
                for &(id, reference) in &g.top_logprobs[step] {
                    let lp = ours[id as usize];
                    worst = worst.max((lp - reference).abs());
                    assert!(
                        (lp - reference).abs() <= tol.logprob,
                        "{at}: logprob of {id} is {lp} instead of {reference}"
                    );
                }
                steps += 1;
            }
        }
        eprintln!(
            "{}: {what} vs {by}: {steps} steps, largest logprob difference {worst:.2e}, \
             top-1 differs at {flips} (widest margin there {widest_flip:.4})",
            self.model
        );
    }
}

/// Per generation, the log-probabilities of the next token after its prompt and after each of
/// its tokens fed back in. The generations run batched, a step of each per forward pass: a
/// row's logits do not depend on the rows beside it, so this only saves time.
fn teacher_force(model: &dyn CausalLm, generations: &[Generation]) -> Vec<Vec<Vec<f64>>> {
    let steps = generations[0].greedy_ids.len();
    assert!(generations.iter().all(|g| g.greedy_ids.len() == steps));
    let mut caches: Vec<_> = generations.iter().map(|_| model.new_cache(4096)).collect();
    let mut forced: Vec<Vec<Vec<f64>>> = generations.iter().map(|_| Vec::new()).collect();
    for step in 0..steps {
        let mut batch: Vec<BatchEntry> = generations
            .iter()
            .zip(&mut caches)
            .map(|(g, cache)| {
                let tokens = match step {
                    0 => &g.prompt_ids[..],
                    _ => std::slice::from_ref(&g.greedy_ids[step - 1]),
                };
                BatchEntry::new(tokens, cache)
            })
            .collect();
        let logits = model.forward_batch(&mut batch).unwrap();
        for (steps, logits) in forced.iter_mut().zip(logits) {
            steps.push(log_softmax(&logits));
        }
    }
    forced
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

/// Higher first, and equal values by lower id so the order is stable.
fn rank(v: &[f64], a: usize, b: usize) -> Ordering {
    v[b].total_cmp(&v[a]).then(a.cmp(&b))
}

fn argmax(v: &[f64]) -> u32 {
    (0..v.len()).min_by(|&a, &b| rank(v, a, b)).unwrap() as u32
}

fn top5(v: &[f64]) -> Vec<(u32, f64)> {
    let mut ids: Vec<usize> = (0..v.len()).collect();
    ids.select_nth_unstable_by(5, |&a, &b| rank(v, a, b));
    ids.truncate(5);
    ids.sort_by(|&a, &b| rank(v, a, b));
    ids.into_iter().map(|i| (i as u32, v[i])).collect()
}
