//! What a grammar adds per token: the llguidance mask (and advancing past the token) beside
//! what every request pays anyway, sampling from the same logits. Qwen2.5's vocabulary
//! (151k tokens); the grammar is a JSON schema with strings, numbers, enums and arrays, walked
//! from random logits. Run: `cargo bench -p spindle-runner --bench constrained_sampling`.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use spindle_chat::Tokenizer;
use spindle_constrain::{grammar, Grammars};
use spindle_runner::sampler::{Sampler, SamplingParams};

const WALKS: u64 = 8;
const MAX_STEPS: usize = 300;

fn main() {
    let path = spindle_hub::pull("qwen2.5-coder-0.5b", &spindle_hub::spindle_home())
        .unwrap_or_else(|e| panic!("qwen2.5-coder-0.5b: {e}"));
    let metadata = spindle_chat::read_tokenizer_metadata(&path).unwrap();
    let tokenizer = Tokenizer::from_gguf(metadata).unwrap();
    let started = Instant::now();
    let grammars = Grammars::new(&tokenizer).unwrap();
    println!(
        "vocabulary {} tokens; grammar compiler built in {:.0} ms",
        tokenizer.vocab_size(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer"},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
            "score": {"type": "number"}
        },
        "required": ["name", "age", "role", "tags", "score"]
    });
    let (mut mask_times, mut sample_times) = (Vec::new(), Vec::new());
    for seed in 0..WALKS {
        let started = Instant::now();
        let mut constraint = grammars.compile(grammar::json_schema(&schema)).unwrap();
        let compile = started.elapsed();
        let params = SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params, &[]);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut steps = 0;
        while steps < MAX_STEPS {
            let logits: Vec<f32> =
                (0..tokenizer.vocab_size()).map(|_| rng.random_range(-4.0..4.0)).collect();
            let baseline = Instant::now();
            std::hint::black_box(sampler.sample(&logits));
            sample_times.push(baseline.elapsed());
            let mut masked = logits;
            let masking = Instant::now();
            constraint.mask(&mut masked).unwrap();
            let token = sampler.sample(&masked).id;
            let sampled = masking.elapsed();
            let advancing = Instant::now();
            if tokenizer.eos_token_ids().contains(&token) {
                break;
            }
            constraint.advance(token).unwrap();
            // The mask and the advance are the grammar's share; the sample under it is not.
            mask_times
                .push(sampled.saturating_sub(*sample_times.last().unwrap()) + advancing.elapsed());
            steps += 1;
        }
        println!("walk {seed}: compiled in {:.2} ms, {steps} tokens", compile.as_secs_f64() * 1e3);
    }
    let (mask, sample) = (median(&mut mask_times), median(&mut sample_times));
    println!(
        "per token: grammar {:.0} µs median [{:.0}-{:.0}], sampling {:.0} µs median [{:.0}-{:.0}]; grammar / sampling = {:.2}",
        micros(mask),
        micros(*mask_times.first().unwrap()),
        micros(*mask_times.last().unwrap()),
        micros(sample),
        micros(*sample_times.first().unwrap()),
        micros(*sample_times.last().unwrap()),
        mask.as_secs_f64() / sample.as_secs_f64()
    );
}

/// Sorts `values` and returns the middle one.
fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
