//! Token sampling: turns one step's raw logits into the next token, with OpenAI / llama.cpp
//! semantics, in pure Rust over `&[f32]`.
//!
//! # Order of operations
//! 1. **Clean up.** A NaN logit counts as `-inf` (never chosen) and `+inf` as `f32::MAX`, so one
//!    bad value cannot poison the softmax.
//! 2. **Penalties**, over the distinct tokens seen so far. First the repetition penalty (HF /
//!    llama.cpp: a positive logit is divided by it, a negative one multiplied) over prompt and
//!    generated tokens, then OpenAI's `presence * (count > 0) + frequency * count` is subtracted,
//!    where `count` counts generated tokens only. Counts live in a map, so a step costs
//!    O(distinct tokens seen), not O(history). A `-inf` logit stays `-inf`, and a finite one stays
//!    finite.
//! 3. **Logprobs** are the log-softmax of the penalised logits at temperature 1, before any
//!    truncation. This is what the user sees as the model's distribution.
//! 4. **Temperature.** 0 means greedy: the exact argmax, with ties going to the lowest id.
//!    `top_k == 1` is the same thing at any temperature.
//! 5. **top_k**, then **top_p** (the smallest most-likely-first set whose mass reaches `p`), then
//!    **min_p** (keep `p >= min_p * p_max`). Each filter works on what the previous one left.
//! 6. Normalise what is left and draw by inverse CDF.
//!
//! # Determinism
//! Each sampler owns a ChaCha8 RNG seeded from `seed`, or from the OS when there is none. Every
//! call to [`Sampler::sample`] draws exactly one uniform `f64` from it, greedy calls included, and
//! draws it before any filter runs. The n-th token therefore always uses the n-th random number,
//! whatever the filters kept. The same params, seed and logits give the same tokens, independent
//! of other requests. Candidates are walked in a fixed order (ties broken by id), and the
//! iteration order of the penalty map never reaches the result.
//!
//! # Cost
//! O(V) per step for the copy, the softmax and the filters. top_k and the top_logprobs
//! alternatives are a selection plus a sort of the k survivors (O(V + k log k)), never a sort of
//! the vocabulary. top_p without top_k first drops every token whose weight is below
//! `(1 - p) / n` of the total. Together those tokens hold less than `1 - p` of the mass, so the
//! nucleus never reaches them. Only the rest is sorted, which for a peaked distribution is a
//! handful of tokens rather than 150k-262k; only a nearly flat distribution (a high
//! temperature) sorts most of the vocabulary.
//!
//! # Degenerate logits
//! If every logit is `-inf` or NaN there is no distribution. The sampler then treats all tokens
//! as equally likely and picks greedily, so it returns token 0 with logprob `-ln V`. It never
//! panics on non-finite values.

use std::cmp::Ordering;
use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The most alternatives a request may ask for with `top_logprobs`, as in OpenAI's API.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Per-request sampling settings with OpenAI / llama.cpp semantics. Missing fields deserialize
/// to their [`Default`] values: temperature 1 and every filter and penalty off.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature. 0 means greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest most-likely-first set whose probability mass reaches `top_p`; 1 disables.
    pub top_p: f32,
    /// Keep tokens with `p >= min_p * p_max`; 0 disables.
    pub min_p: f32,
    /// Over tokens seen in the prompt or output, a positive logit is divided by this value and a
    /// negative one multiplied by it; 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token generated so far (OpenAI, in [-2, 2]).
    pub presence_penalty: f32,
    /// Subtracted from a generated token's logit once per time it was generated (OpenAI, in
    /// [-2, 2]).
    pub frequency_penalty: f32,
    /// Seed of the request's RNG; `None` takes a random one from the OS.
    pub seed: Option<u64>,
    /// `Some(n)` also reports the n most likely tokens at each step (n <= 20).
    pub top_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            top_logprobs: None,
        }
    }
}

/// A sampling parameter outside its allowed range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("invalid sampling parameter `{field}`: {reason}")]
pub struct SamplingError {
    /// The field's name as it appears in [`SamplingParams`] and the OpenAI request.
    pub field: &'static str,
    /// What the field must be, and the value that was given.
    pub reason: String,
}

impl SamplingParams {
    /// Checks every field's range and names the first bad one. [`Sampler`] does not check its
    /// params, so call this first.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let (t, p, min_p, rep) =
            (self.temperature, self.top_p, self.min_p, self.repetition_penalty);
        let (presence, frequency) = (self.presence_penalty, self.frequency_penalty);
        let openai = -2.0..=2.0;
        let checks = [
            (t.is_finite() && t >= 0.0, "temperature", "a finite number >= 0", t),
            (p > 0.0 && p <= 1.0, "top_p", "in (0, 1]", p),
            ((0.0..=1.0).contains(&min_p), "min_p", "in [0, 1]", min_p),
            (rep.is_finite() && rep > 0.0, "repetition_penalty", "a finite number > 0", rep),
            (openai.contains(&presence), "presence_penalty", "in [-2, 2]", presence),
            (openai.contains(&frequency), "frequency_penalty", "in [-2, 2]", frequency),
        ];
        if let Some((_, field, rule, got)) = checks.into_iter().find(|c| !c.0) {
            return Err(SamplingError { field, reason: format!("must be {rule}, got {got}") });
        }
        match self.top_logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(SamplingError {
                field: "top_logprobs",
                reason: format!("must be at most {MAX_TOP_LOGPROBS}, got {n}"),
            }),
            _ => Ok(()),
        }
    }
}

/// One sampled token and what the user may see of the distribution it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub id: u32,
    /// Log-probability of `id` under the penalised logits at temperature 1. Always filled.
    pub logprob: f32,
    /// With `top_logprobs: Some(n)`, the n most likely tokens and their logprobs, highest first
    /// (ties to the lowest id). Tokens with a `-inf` logit are left out, so the list is shorter
    /// when fewer than n tokens are possible. Empty when not requested.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Samples one request's tokens. It owns the request's RNG and its token counts, so it must live
/// exactly as long as the request.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Every token seen in the prompt or the output, mapped to how many times it was generated
    /// (0 for a token seen only in the prompt).
    seen: HashMap<u32, u32>,
}

impl Sampler {
    /// Creates the sampler for one request. The prompt ids count as seen for the repetition
    /// penalty but not for presence and frequency. `params` should already have passed
    /// [`SamplingParams::validate`].
    pub fn new(params: SamplingParams, prompt_ids: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        let mut seen = HashMap::new();
        for &id in prompt_ids {
            seen.entry(id).or_insert(0);
        }
        Self { params, rng: ChaCha8Rng::seed_from_u64(seed), seen }
    }

    /// Applies penalties and filters, draws a token and records it in the history.
    /// `logits` are the model's raw logits for the next token.
    ///
    /// # Panics
    /// If `logits` is empty: a model always has a vocabulary.
    pub fn sample(&mut self, logits: &[f32]) -> SampledToken {
        self.choose(logits, None)
    }

    /// Records `id` as the next token whatever the distribution says (the engine closing a
    /// reasoning block), reporting its logprobs like a sampled token. It consumes one random
    /// number like [`Sampler::sample`], so the tokens after it do not depend on which it was.
    pub fn force(&mut self, logits: &[f32], id: u32) -> SampledToken {
        self.choose(logits, Some(id))
    }

    fn choose(&mut self, logits: &[f32], forced: Option<u32>) -> SampledToken {
        assert!(!logits.is_empty(), "cannot sample from an empty vocabulary");
        // Drawn first and unconditionally, so the stream never depends on the filters.
        let u: f64 = self.rng.random();
        let mut logits: Vec<f32> = logits.iter().map(|&l| clean(l)).collect();
        apply_penalties(&self.params, &self.seen, &mut logits);

        let (mut best, mut max) = argmax(&logits);
        let degenerate = max == f32::NEG_INFINITY;
        if degenerate {
            logits.fill(0.0);
            (best, max) = (0, 0.0);
        }
        // f32 exp is twice as fast as f64 and exact enough per term; the sum needs f64.
        let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        let log_norm = f64::from(max) + sum.ln();
        // A forced id past the logits (a special token outside the LM head) is impossible.
        let logprob = |id: u32| {
            logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| (f64::from(l) - log_norm) as f32)
        };

        let greedy = degenerate || self.params.temperature == 0.0 || self.params.top_k == 1;
        let id = if let Some(id) = forced {
            id
        } else if greedy {
            best
        } else {
            draw(&candidates(&self.params, &logits, max), u).unwrap_or(best)
        };
        let top_logprobs = match self.params.top_logprobs {
            Some(n) => top_ids(&logits, n).into_iter().map(|i| (i, logprob(i))).collect(),
            None => Vec::new(),
        };
        *self.seen.entry(id).or_insert(0) += 1;
        SampledToken { id, logprob: logprob(id), top_logprobs }
    }
}

/// NaN becomes `-inf` (never chosen) and `+inf` becomes the largest finite value, so the softmax
/// stays defined while a `+inf` token still wins.
fn clean(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l.min(f32::MAX)
    }
}

/// Repetition, presence and frequency penalties over the seen tokens. Each token is changed
/// independently of the others, so the map's random iteration order cannot change the result.
fn apply_penalties(p: &SamplingParams, seen: &HashMap<u32, u32>, logits: &mut [f32]) {
    if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
        return;
    }
    for (&id, &count) in seen {
        // A prompt id can lie outside the logits (e.g. a special token past the LM head).
        let Some(l) = logits.get_mut(id as usize) else {
            continue;
        };
        // Clamping below would turn a banned token back into a possible one.
        if *l == f32::NEG_INFINITY {
            continue;
        }
        let mut x = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
        if count > 0 {
            x -= p.presence_penalty + p.frequency_penalty * count as f32;
        }
        *l = x.clamp(-f32::MAX, f32::MAX);
    }
}

/// The highest logit and its id; ties go to the lowest id.
pub(crate) fn argmax(logits: &[f32]) -> (u32, f32) {
    let mut best = (0, logits[0]);
    for (id, &l) in logits.iter().enumerate().skip(1) {
        if l > best.1 {
            best = (id as u32, l);
        }
    }
    best
}

/// The ids of the `n` highest finite logits, highest first, ties to the lowest id, in
/// O(V + n log n): a cheap bound, a selection and a sort of the n survivors.
fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    let by_logit = |a: &u32, b: &u32| {
        let (la, lb) = (logits[*a as usize], logits[*b as usize]);
        lb.partial_cmp(&la).unwrap_or(Ordering::Equal).then(a.cmp(b))
    };
    let floor = selection_floor(logits, n);
    let mut ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&id| {
            let l = logits[id as usize];
            l > f32::NEG_INFINITY && l >= floor
        })
        .collect();
    if n < ids.len() {
        ids.select_nth_unstable_by(n, by_logit);
        ids.truncate(n);
    }
    ids.sort_unstable_by(by_logit);
    ids
}

/// A logit that the `n`-th highest is at least: the smallest maximum of `n` or more equal chunks
/// (their maxima are that many distinct tokens), so nothing below it can make the top `n`.
/// Selecting over the vocabulary itself costs milliseconds; above the floor there are usually
/// only a few hundred ids. A shorter last chunk is left out: its maximum is close to a random
/// logit (151,936 ids in chunks for 3 left one of a single id, and half the vocabulary above it).
fn selection_floor(logits: &[f32], n: usize) -> f32 {
    if n >= logits.len() {
        return f32::NEG_INFINITY;
    }
    let chunk_max = |c: &[f32]| c.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    logits.chunks_exact(logits.len() / n).map(chunk_max).fold(f32::INFINITY, f32::min)
}

/// The tokens that survive top_k, top_p and min_p at the params' temperature (which must be
/// positive), each with its unnormalised probability `exp((logit - max) / temperature)`, in a fixed
/// order. The argmax has weight 1 and always survives, so the result is never empty.
fn candidates(p: &SamplingParams, logits: &[f32], max: f32) -> Vec<(u32, f64)> {
    let weight = |id: u32| f64::from(((logits[id as usize] - max) / p.temperature).exp());
    let (mut cands, sorted): (Vec<(u32, f64)>, bool) = if p.top_k > 0 && p.top_k < logits.len() {
        (top_ids(logits, p.top_k).into_iter().map(|id| (id, weight(id))).collect(), true)
    } else {
        ((0..logits.len() as u32).map(|id| (id, weight(id))).collect(), false)
    };
    // A -inf logit, or a weight that underflowed, can never be drawn.
    cands.retain(|c| c.1 > 0.0);

    if p.top_p < 1.0 {
        let top_p = f64::from(p.top_p);
        let total: f64 = cands.iter().map(|c| c.1).sum();
        if !sorted {
            // Each dropped token weighs less than (1 - p) * total / n, so together they weigh
            // less than (1 - p) * total: what is kept still reaches p, and since it is a
            // most-likely-first prefix it contains the nucleus.
            let floor = (1.0 - top_p) * total / cands.len() as f64;
            cands.retain(|c| c.1 >= floor);
            cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        }
        let target = top_p * total;
        let mut mass = 0.0;
        let keep = cands.iter().position(|c| {
            mass += c.1;
            mass >= target
        });
        // Rounding may keep the running sum just short of the target: then keep everything.
        cands.truncate(keep.map_or(cands.len(), |i| i + 1));
    }
    if p.min_p > 0.0 {
        let floor = f64::from(p.min_p) * cands.iter().fold(0.0, |m, c| c.1.max(m));
        cands.retain(|c| c.1 >= floor);
    }
    cands
}

/// Inverse-CDF draw with `u` in [0, 1): the first candidate whose running weight exceeds
/// `u * total`. It is `None` only when there are no candidates.
fn draw(cands: &[(u32, f64)], u: f64) -> Option<u32> {
    let x = u * cands.iter().map(|c| c.1).sum::<f64>();
    let mut mass = 0.0;
    // Rounding can leave x at the full total: the last candidate then takes it.
    let chosen = cands.iter().find(|c| {
        mass += c.1;
        x < mass
    });
    chosen.or(cands.last()).map(|c| c.0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Seeded params with everything else at its default, adjusted by `f`.
    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams { seed: Some(7), ..SamplingParams::default() };
        f(&mut p);
        p
    }

    /// Logits whose softmax is `probs`.
    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    /// How often each token comes out over `n` draws on the same logits.
    fn histogram(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut sampler = Sampler::new(p, &[]);
        let mut counts = vec![0; logits.len()];
        for _ in 0..n {
            counts[sampler.sample(logits).id as usize] += 1;
        }
        counts
    }

    fn reference_log_softmax(logits: &[f32]) -> Vec<f64> {
        let max = logits.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
        let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
        logits.iter().map(|&l| f64::from(l) - max - sum.ln()).collect()
    }

    #[test]
    fn greedy_picks_the_argmax_and_the_lowest_id_on_ties() {
        let mut s = Sampler::new(params(|p| p.temperature = 0.0), &[]);
        assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9]).id, 1);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0, 3.0]).id, 1);
        assert_eq!(s.sample(&[5.0, 5.0]).id, 0);
    }

    #[test]
    fn top_k_1_is_greedy_at_any_temperature() {
        let logits = [0.3, 1.0, 1.2, 1.2, -4.0];
        for temperature in [0.1, 1.0, 5.0, 100.0] {
            let counts =
                histogram(params(|p| (p.temperature, p.top_k) = (temperature, 1)), &logits, 200);
            assert_eq!(counts, vec![0, 0, 200, 0, 0], "temperature {temperature}");
        }
    }

    #[test]
    fn top_k_2_never_leaves_the_top_two() {
        let logits = [1.0, 3.0, 2.9, 2.8, 0.5, 2.7];
        let counts = histogram(params(|p| (p.temperature, p.top_k) = (2.0, 2)), &logits, 500);
        assert_eq!(counts[0] + counts[3] + counts[4] + counts[5], 0, "{counts:?}");
        assert!(counts[1] > 0 && counts[2] > 0, "{counts:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        let logits = logits_of(&[0.5, 0.3, 0.2]);
        let counts = histogram(params(|p| p.top_p = 0.7), &logits, 2000);
        assert_eq!(counts[2], 0, "{counts:?}");
        assert!(counts[0] > counts[1] && counts[1] > 0, "{counts:?}");
    }

    #[test]
    fn top_p_prefilter_keeps_the_nucleus_in_a_long_tail() {
        // Two heavy tokens in the middle of a 1000-token vocabulary with a flat 5% tail.
        let mut probs = vec![0.05 / 998.0; 1000];
        probs[500] = 0.6;
        probs[900] = 0.35;
        let counts = histogram(params(|p| p.top_p = 0.9), &logits_of(&probs), 1000);
        assert_eq!(counts[500] + counts[900], 1000);
        assert!(counts[900] > 200, "{}", counts[900]);
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_maximum() {
        let logits = logits_of(&[0.6, 0.32, 0.05, 0.03]);
        let counts = histogram(params(|p| p.min_p = 0.5), &logits, 2000);
        assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
        assert!(counts[1] > 400, "{counts:?}");
    }

    #[test]
    fn filters_match_a_full_sort_reference() {
        // The reference sorts everything and applies each filter literally.
        fn reference(p: &SamplingParams, logits: &[f32]) -> BTreeSet<u32> {
            let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
            let t = f64::from(p.temperature);
            let mut v: Vec<(u32, f64)> = (0..logits.len() as u32)
                .filter(|&i| logits[i as usize].is_finite())
                .map(|i| (i, ((f64::from(logits[i as usize]) - f64::from(max)) / t).exp()))
                .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if p.top_k > 0 {
                v.truncate(p.top_k);
            }
            let total: f64 = v.iter().map(|c| c.1).sum();
            let mut mass = 0.0;
            for i in 0..v.len() {
                mass += v[i].1;
                if mass >= f64::from(p.top_p) * total {
                    v.truncate(i + 1);
                    break;
                }
            }
            let floor = f64::from(p.min_p) * v[0].1;
            v.iter().filter(|c| c.1 >= floor).map(|c| c.0).collect()
        }
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for case in 0..300 {
            let mut logits: Vec<f32> = (0..200).map(|_| rng.random_range(-6.0..6.0)).collect();
            logits[rng.random_range(0..200)] = f32::NEG_INFINITY;
            let p = params(|p| {
                p.temperature = rng.random_range(0.5..2.0);
                p.top_k = [0, 5, 50, 199, 500][case % 5];
                p.top_p = [1.0, 0.95, 0.5, 0.1][case % 4];
                p.min_p = [0.0, 0.05, 0.3][case % 3];
            });
            let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
            let got: BTreeSet<u32> = candidates(&p, &logits, max).iter().map(|c| c.0).collect();
            assert_eq!(got, reference(&p, &logits), "case {case}: {p:?}");
        }
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let rep = |pen: f32, prompt: &[u32], logits: &[f32]| {
            let p = params(|p| (p.temperature, p.repetition_penalty) = (0.0, pen));
            Sampler::new(p, prompt).sample(logits).id
        };
        // 2.0 / 1.2 = 1.67 < 1.8 and -1.0 * 1.2 = -1.2 < -1.1: both flip to token 1.
        assert_eq!(rep(1.0, &[0], &[2.0, 1.8]), 0);
        assert_eq!(rep(1.2, &[0], &[2.0, 1.8]), 1);
        assert_eq!(rep(1.0, &[0], &[-1.0, -1.1]), 0);
        assert_eq!(rep(1.2, &[0], &[-1.0, -1.1]), 1);
        // Dividing a negative logit would raise it to -0.83 and keep token 0.
        assert_eq!(rep(1.2, &[0], &[-1.0, -0.9, -5.0]), 1);

        // Generated tokens count too: token 0 wins, is penalised, then both are.
        let mut s =
            Sampler::new(params(|p| (p.temperature, p.repetition_penalty) = (0.0, 1.2)), &[]);
        let ids: Vec<u32> = (0..3).map(|_| s.sample(&[2.0, 1.8]).id).collect();
        assert_eq!(ids, [0, 1, 0]);
    }

    #[test]
    fn presence_and_frequency_penalties_lower_logprobs_by_the_documented_amounts() {
        let p = params(|p| {
            (p.temperature, p.presence_penalty, p.frequency_penalty) = (0.0, 0.5, 0.25);
            p.top_logprobs = Some(4);
        });
        // Token 1 is in the prompt only: presence and frequency must leave it alone.
        let mut s = Sampler::new(p, &[1]);
        let logits = [1.0, 0.0, 0.0, 0.0];
        let expect = |l0: f64| l0 - (l0.exp() + 3.0).ln();

        let first = s.sample(&logits);
        assert_eq!(first.id, 0);
        assert!((f64::from(first.logprob) - expect(1.0)).abs() < 1e-6);
        // Generated once: 1 - 0.5 - 0.25.
        let second = s.sample(&logits);
        assert!((f64::from(second.logprob) - expect(0.25)).abs() < 1e-6, "{second:?}");
        // Generated twice: 1 - 0.5 - 2 * 0.25 = 0, a four-way tie.
        let third = s.sample(&logits);
        assert_eq!(third.id, 0);
        assert!((f64::from(third.logprob) - 0.25f64.ln()).abs() < 1e-6, "{third:?}");
        let token_1 = third.top_logprobs.iter().find(|t| t.0 == 1).unwrap();
        assert!((f64::from(token_1.1) - 0.25f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn same_seed_repeats_and_another_or_no_seed_differs() {
        let run = |seed: Option<u64>| {
            let mut s = Sampler::new(
                params(|p| (p.seed, p.temperature, p.top_p) = (seed, 0.9, 0.95)),
                &[3],
            );
            (0..200)
                .map(|step| {
                    let logits: Vec<f32> =
                        (0..10).map(|i| ((i * 7 + step) % 10) as f32 * 0.2).collect();
                    s.sample(&logits).id
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(Some(42)), run(Some(42)));
        assert_ne!(run(Some(42)), run(Some(43)));
        // Without a seed each request gets its own from the OS.
        assert_ne!(run(None), run(None));
    }

    #[test]
    fn each_sample_consumes_exactly_one_random_number() {
        let logits = [0.5, 1.0, 0.2, 0.9, 0.0];
        let mut greedy = Sampler::new(params(|p| p.temperature = 0.0), &[]);
        let mut filtered =
            Sampler::new(params(|p| (p.top_k, p.top_p, p.min_p) = (3, 0.8, 0.2)), &[]);
        let mut plain = Sampler::new(params(|_| ()), &[]);
        for _ in 0..50 {
            greedy.sample(&logits);
            filtered.sample(&logits);
            plain.sample(&logits);
        }
        let next = |s: &Sampler| s.rng.clone().random::<u64>();
        assert_eq!(next(&greedy), next(&filtered));
        assert_eq!(next(&greedy), next(&plain));
    }

    #[test]
    fn draws_follow_the_tempered_distribution() {
        let probs = [0.1, 0.2, 0.3, 0.4];
        let n = 20_000;
        // At temperature 0.5 the probabilities are squared and renormalised.
        let squared: Vec<f64> = probs.iter().map(|p| p * p / 0.3).collect();
        for (temperature, expected) in [(1.0, probs.to_vec()), (0.5, squared)] {
            let counts = histogram(params(|p| p.temperature = temperature), &logits_of(&probs), n);
            let chi2: f64 = counts
                .iter()
                .zip(&expected)
                .map(|(&c, &e)| (c as f64 - e * n as f64).powi(2) / (e * n as f64))
                .sum();
            // 3 degrees of freedom: 20 has a p-value of about 2e-4.
            assert!(chi2 < 20.0, "temperature {temperature}: {counts:?}, chi2 {chi2}");
        }
    }

    #[test]
    fn the_selection_floor_ignores_a_short_last_chunk() {
        // Chunks of 3: [9 8 7] [6 5 4] [3 2 1] and [0], whose maximum would let every id pass.
        let descending: Vec<f32> = (0..10).rev().map(|l| l as f32).collect();
        assert_eq!(selection_floor(&descending, 3), 3.0);
        assert_eq!(top_ids(&descending, 3), vec![0, 1, 2]);
        assert_eq!(selection_floor(&descending, 10), f32::NEG_INFINITY);
    }

    #[test]
    fn logprobs_are_the_log_softmax_and_top_n_is_sorted() {
        let logits = [0.3, -1.2, 2.5, 0.9, 2.5, -0.4, 1.7];
        let reference = reference_log_softmax(&logits);
        let mut s = Sampler::new(params(|p| p.top_logprobs = Some(3)), &[]);
        for _ in 0..20 {
            let t = s.sample(&logits);
            assert!((f64::from(t.logprob) - reference[t.id as usize]).abs() < 1e-6, "{t:?}");
            let ids: Vec<u32> = t.top_logprobs.iter().map(|x| x.0).collect();
            assert_eq!(ids, [2, 4, 6]);
            for (id, lp) in &t.top_logprobs {
                assert!((f64::from(*lp) - reference[*id as usize]).abs() < 1e-6);
            }
        }
        let none = Sampler::new(params(|_| ()), &[]).sample(&logits);
        assert!(none.top_logprobs.is_empty());
        assert!(none.logprob < 0.0);
    }

    #[test]
    fn non_finite_logits_never_panic_or_win() {
        let logits = [f32::NAN, f32::NEG_INFINITY, 0.5, f32::NAN, 0.2];
        let counts = histogram(params(|p| p.top_logprobs = Some(5)), &logits, 300);
        assert_eq!(counts[0] + counts[1] + counts[3], 0, "{counts:?}");
        let t = Sampler::new(params(|p| p.top_logprobs = Some(5)), &[]).sample(&logits);
        assert_eq!(t.top_logprobs.len(), 2, "only two tokens are possible");
        assert!(t.logprob.is_finite());

        // Penalties never revive a banned token, not even as a -inf logprob alternative.
        let p = params(|p| (p.repetition_penalty, p.top_logprobs) = (1.5, Some(2)));
        let t = Sampler::new(p, &[1]).sample(&[0.0, f32::NEG_INFINITY]);
        assert_eq!(t.top_logprobs.len(), 1, "{t:?}");

        // Nothing usable: every token counts as equal and greedy picks token 0.
        let nothing = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
        let t = Sampler::new(params(|_| ()), &[]).sample(&nothing);
        assert_eq!(t.id, 0);
        assert!((t.logprob - -(3.0f32).ln()).abs() < 1e-6);

        // +inf is certain.
        let counts = histogram(params(|_| ()), &[0.0, f32::INFINITY, 1.0], 100);
        assert_eq!(counts, [0, 100, 0]);
        let t = Sampler::new(params(|_| ()), &[]).sample(&[0.0, f32::INFINITY, 1.0]);
        assert_eq!((t.id, t.logprob), (1, 0.0));
        let t = Sampler::new(params(|p| p.repetition_penalty = 2.0), &[1])
            .sample(&[0.0, f32::INFINITY]);
        assert_eq!((t.id, t.logprob), (1, 0.0));
    }

    #[test]
    fn validate_names_each_bad_field() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        let edges = params(|p| {
            (p.temperature, p.top_p, p.min_p) = (0.0, 1.0, 1.0);
            (p.presence_penalty, p.frequency_penalty, p.top_logprobs) = (-2.0, 2.0, Some(20));
        });
        assert_eq!(edges.validate(), Ok(()));

        type Break = fn(&mut SamplingParams);
        let bad: [(&str, Break); 12] = [
            ("temperature", |p| p.temperature = -0.1),
            ("temperature", |p| p.temperature = f32::NAN),
            ("temperature", |p| p.temperature = f32::INFINITY),
            ("top_p", |p| p.top_p = 0.0),
            ("top_p", |p| p.top_p = 1.5),
            ("min_p", |p| p.min_p = -0.1),
            ("min_p", |p| p.min_p = 1.1),
            ("repetition_penalty", |p| p.repetition_penalty = 0.0),
            ("presence_penalty", |p| p.presence_penalty = 2.5),
            ("frequency_penalty", |p| p.frequency_penalty = -2.5),
            ("frequency_penalty", |p| p.frequency_penalty = f32::NAN),
            ("top_logprobs", |p| p.top_logprobs = Some(21)),
        ];
        for (field, break_it) in bad {
            let err = params(break_it).validate().unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn missing_fields_deserialize_to_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"top_k": 40, "seed": 3}"#).unwrap();
        assert_eq!(p, SamplingParams { top_k: 40, seed: Some(3), ..SamplingParams::default() });
    }

    #[test]
    fn forcing_reports_the_forced_token_and_keeps_the_random_stream_in_step() {
        let logits = logits_of(&[0.5, 0.3, 0.2]);
        let p = params(|p| {
            p.temperature = 1.0;
            p.top_logprobs = Some(2);
        });
        let mut forced = Sampler::new(p.clone(), &[]);
        let token = forced.force(&logits, 2);
        assert_eq!(token.id, 2);
        assert!((f64::from(token.logprob) - 0.2f64.ln()).abs() < 1e-6);
        assert_eq!(token.top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1]);
        // An id outside the logits is impossible, not a panic.
        assert_eq!(forced.force(&logits, 99).logprob, f32::NEG_INFINITY);
        // Two forced steps used two random numbers, as two sampled steps would.
        let mut sampled = Sampler::new(p, &[]);
        sampled.sample(&logits);
        sampled.sample(&logits);
        let after: Vec<u32> = (0..20).map(|_| forced.sample(&logits).id).collect();
        let expected: Vec<u32> = (0..20).map(|_| sampled.sample(&logits).id).collect();
        assert_eq!(after, expected);
    }
}
