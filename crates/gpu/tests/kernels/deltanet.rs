//! Gated DeltaNet's kernels (convolution with its window, L2 norms of q and k, the delta rule,
//! the gated norm, and the layer's mixing part they make) against the CPU's own functions in
//! `spindle_models::linear_attention`, on the random hybrid fixtures' shape (both head
//! mappings) and a ragged one, with several sequences of a batch in one dispatch, each from its
//! own state slot; and bitwise batch invariance.

use rand_chacha::ChaCha8Rng;
use spindle_gpu::{
    CausalConv, DeltaNetShape, DeltaRule, DeltaRuleInputs, GatedRmsNorm, Gpu, GpuTensor, L2Norm,
    LinearAttention, LinearAttentionHostWeights, LinearAttentionWeights, LinearRun, LinearRuns,
    LinearStates, Projected,
};
use spindle_models::linear_attention as cpu;

use crate::harness::{check, gpu_or_skip, rng, same_bits, uniform};

/// Per value, relative to `max(1, |want|)`: four products summed in the CPU's order, then the
/// device's `exp` in SiLU (measured on lavapipe: 1.2e-7).
const CONV_TOLERANCE: f64 = 1e-6;
/// Per value, relative to the largest `|y|` of its head: the GPU's tree of squares against the
/// CPU's running sum, and `x / r · scale` against `x · (scale / r)` (measured on lavapipe: 1.8e-7).
const L2_TOLERANCE: f64 = 1e-6;
/// Per value, relative to `max(1, |want|)`, outputs and matrices alike, over up to 5 tokens
/// from random states: the same sums in the same order, but the device's `exp`/`log` in the
/// decay and β, and fused multiply-adds (measured on lavapipe: 2.1e-7).
const RULE_TOLERANCE: f64 = 1e-6;
/// Per value, relative to `max(1, |want|)`: the norm's rounding, then `silu(z)` through the
/// device's `exp` (measured on lavapipe: 3.0e-7).
const GATED_NORM_TOLERANCE: f64 = 1e-6;
/// The whole mixing part against the CPU layer, which runs a multi-token sequence through the
/// chunked form of the rule (a triangular solve, so other rounding): outputs relative to
/// `max(1, |want|)` after the gated norm, states likewise (measured on lavapipe: outputs 1.3e-6,
/// states 2.1e-7).
const LAYER_TOLERANCE: f64 = 1e-5;

/// The random hybrid fixtures' linear layers (`tests/data/hybrid/*/config.json`): 2 key heads,
/// 4 value heads, all of 16, a convolution of 4; grouped as HF checkpoints.
const FIXTURE: DeltaNetShape =
    DeltaNetShape { k_heads: 2, v_heads: 4, k_dim: 16, v_dim: 16, tiled: false, conv_kernel: 4 };
/// Widths off every power of two, three value heads per key head (198 channels).
const RAGGED: DeltaNetShape =
    DeltaNetShape { k_heads: 1, v_heads: 3, k_dim: 20, v_dim: 13, tiled: false, conv_kernel: 4 };

fn shapes() -> [DeltaNetShape; 3] {
    [FIXTURE, DeltaNetShape { tiled: true, ..FIXTURE }, RAGGED]
}

fn heads(s: DeltaNetShape) -> cpu::DeltaHeads {
    cpu::DeltaHeads {
        k_heads: s.k_heads,
        v_heads: s.v_heads,
        k_dim: s.k_dim,
        v_dim: s.v_dim,
        tiled: s.tiled,
    }
}

/// `(rows, slot)` per sequence, rows in that order and slots not: 3 rows (as many as the
/// window holds) in slot 2, a decode step's 1 in slot 0, and 2 (fewer than the window holds,
/// so part of the old window stays) in slot 1.
const BATCH: [(usize, usize); 3] = [(3, 2), (1, 0), (2, 1)];

fn runs(batch: &[(usize, usize)]) -> Vec<LinearRun> {
    let mut first_row = 0;
    batch
        .iter()
        .map(|&(rows, slot)| {
            let run = LinearRun { first_row, rows, slot, history: None };
            first_row += rows;
            run
        })
        .collect()
}

fn up(gpu: &Gpu, values: &[f32]) -> GpuTensor {
    gpu.upload(values).unwrap()
}

fn wide(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| v as f64).collect()
}

/// `max(1, |w|)` per value.
fn at_least_one(want: &[f32]) -> Vec<f64> {
    want.iter().map(|w| (w.abs() as f64).max(1.0)).collect()
}

/// Host states of `slots` sequences, random, small enough that the rule stays in range.
fn random_states(rng: &mut ChaCha8Rng, s: DeltaNetShape, slots: usize) -> (Vec<f32>, Vec<f32>) {
    let conv = uniform(rng, slots * s.conv_state_len());
    let recurrent = uniform(rng, slots * s.recurrent_state_len()).iter().map(|v| v * 0.3).collect();
    (conv, recurrent)
}

/// Slot `slot`'s part of slot-major values of `len` a slot.
fn slot(values: &[f32], slot: usize, len: usize) -> &[f32] {
    &values[slot * len..][..len]
}

#[test]
fn the_convolution_matches_the_cpu_per_sequence_and_moves_each_window_on() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(41);
    let conv = CausalConv::new(gpu).unwrap();
    for s in shapes() {
        let (channels, kernel) = (s.conv_channels(), s.conv_kernel);
        let tokens: usize = BATCH.iter().map(|b| b.0).sum();
        let x = uniform(&mut rng, tokens * channels);
        let weight = uniform(&mut rng, channels * kernel);
        let (windows, recurrent) = random_states(&mut rng, s, BATCH.len());
        let states = LinearStates::upload(gpu, s, &windows, &recurrent).unwrap();
        let runs_host = runs(&BATCH);
        let batch = LinearRuns::upload(gpu, runs_host.clone()).unwrap();
        let (on_gpu, w) = (up(gpu, &x), up(gpu, &weight));
        let (qk, v) = gpu
            .run(|step| {
                let out = conv.forward(step, &on_gpu, &w, &states, &batch)?;
                Ok((step.read(&out.qk), step.read(&out.v)))
            })
            .unwrap();
        let (qk, v) = (qk.values().unwrap(), v.values().unwrap());
        let got_windows = gpu.download(&states.conv).unwrap();
        let qk_width = 2 * s.key_dim();
        for run in runs_host {
            let rows = run.first_row..run.first_row + run.rows;
            let mut want = x[rows.start * channels..rows.end * channels].to_vec();
            let mut window = slot(&windows, run.slot, s.conv_state_len()).to_vec();
            cpu::causal_conv_silu(&mut want, &weight, channels, kernel, &mut window);
            let got: Vec<f32> = rows
                .clone()
                .flat_map(|r| {
                    let (qk_row, v_row) =
                        (&qk[r * qk_width..][..qk_width], &v[r * s.value_dim()..]);
                    qk_row.iter().chain(&v_row[..s.value_dim()]).copied().collect::<Vec<_>>()
                })
                .collect();
            let what = format!("convolution {s:?}, {} rows in slot {}", run.rows, run.slot);
            check(&what, &got, &wide(&want), &at_least_one(&want), CONV_TOLERANCE);
            // The window holds inputs, copied: exactly the CPU's.
            let got_window = slot(&got_windows, run.slot, s.conv_state_len());
            same_bits(&format!("{what}: window"), got_window, &window);
        }
    }
    // Two sequences on one slot would move it on at once; rows or a slot past the step's are
    // refused before anything is recorded.
    let twice = [
        LinearRun { first_row: 0, rows: 1, slot: 0, history: None },
        LinearRun { first_row: 1, rows: 1, slot: 0, history: None },
    ];
    assert!(LinearRuns::upload(gpu, twice.to_vec()).is_err());
    let s = FIXTURE;
    let states = LinearStates::zeros(gpu, s, 2).unwrap();
    let (x, w) =
        (up(gpu, &vec![0.0; 2 * s.conv_channels()]), up(gpu, &vec![0.0; s.conv_channels() * 4]));
    for run in [
        LinearRun { first_row: 1, rows: 2, slot: 0, history: None },
        LinearRun { first_row: 0, rows: 1, slot: 2, history: None },
    ] {
        let runs = LinearRuns::upload(gpu, vec![run]).unwrap();
        assert!(
            gpu.run(|step| conv.forward(step, &x, &w, &states, &runs).map(|_| ())).is_err(),
            "{run:?}"
        );
    }
}

#[test]
fn l2_norms_match_the_cpu_with_q_scaled_and_k_not() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(43);
    let norm = L2Norm::new(gpu).unwrap();
    for s in [FIXTURE, RAGGED] {
        let (tokens, key_dim, d) = (5, s.key_dim(), s.k_dim);
        let qk = uniform(&mut rng, tokens * 2 * key_dim);
        let q_scale = 1.0 / (d as f32).sqrt();
        let scales: Vec<f32> =
            (0..2 * key_dim).map(|i| if i < key_dim { q_scale } else { 1.0 }).collect();
        let (x, sc) = (up(gpu, &qk), up(gpu, &scales));
        let got = crate::harness::computed(gpu, |step| norm.forward(step, &x, d, &sc));
        let mut want = Vec::new();
        for row in qk.chunks(2 * key_dim) {
            let (mut q, mut k) = (row[..key_dim].to_vec(), row[key_dim..].to_vec());
            cpu::l2_normalize(&mut q, d, q_scale);
            cpu::l2_normalize(&mut k, d, 1.0);
            want.extend(q.into_iter().chain(k));
        }
        let scale: Vec<f64> = want
            .chunks(d)
            .flat_map(|head| vec![head.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64)); d])
            .collect();
        check(&format!("l2 norm {s:?}"), &got, &wide(&want), &scale, L2_TOLERANCE);
    }
}

/// Random per-head decay weights: `−exp(A_log)` (as the fixtures, −0.1 − 0.05·h) and `dt_bias`.
fn decay_weights(rng: &mut ChaCha8Rng, s: DeltaNetShape) -> (Vec<f32>, Vec<f32>) {
    let neg_decay_rate = (0..s.v_heads).map(|h| -0.1 - h as f32 * 0.05).collect();
    (neg_decay_rate, uniform(rng, s.v_heads))
}

#[test]
fn the_delta_rule_matches_the_cpu_token_by_token_for_each_sequence_and_slot() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(47);
    let rule = DeltaRule::new(gpu).unwrap();
    // Longer runs than the convolution's test: the recurrence is what accumulates.
    let batch = [(5, 2), (1, 0), (3, 1)];
    for s in shapes() {
        let tokens: usize = batch.iter().map(|b| b.0).sum();
        let (key_dim, d) = (s.key_dim(), s.k_dim);
        let mut qk = uniform(&mut rng, tokens * 2 * key_dim);
        for row in qk.chunks_mut(2 * key_dim) {
            let (q, k) = row.split_at_mut(key_dim);
            cpu::l2_normalize(q, d, 1.0 / (d as f32).sqrt());
            cpu::l2_normalize(k, d, 1.0);
        }
        let v = uniform(&mut rng, tokens * s.value_dim());
        let a: Vec<f32> = uniform(&mut rng, tokens * s.v_heads).iter().map(|x| x * 4.0).collect();
        let b: Vec<f32> = uniform(&mut rng, tokens * s.v_heads).iter().map(|x| x * 4.0).collect();
        let (neg_decay_rate, dt_bias) = decay_weights(&mut rng, s);
        let (windows, recurrent) = random_states(&mut rng, s, batch.len());
        let states = LinearStates::upload(gpu, s, &windows, &recurrent).unwrap();
        let runs_host = runs(&batch);
        let on_device = LinearRuns::upload(gpu, runs_host.clone()).unwrap();
        let (qk_d, v_d, a_d, b_d) = (up(gpu, &qk), up(gpu, &v), up(gpu, &a), up(gpu, &b));
        let decay = up(gpu, &[neg_decay_rate.clone(), dt_bias.clone()].concat());
        let inputs = DeltaRuleInputs { qk: &qk_d, v: &v_d, a: &a_d, b: &b_d };
        let got = crate::harness::computed(gpu, |step| {
            rule.forward(step, &inputs, &decay, &states, &on_device)
        });
        let got_states = gpu.download(&states.recurrent).unwrap();
        let vh = s.v_heads;
        for run in runs_host {
            let rows = run.first_row..run.first_row + run.rows;
            let (mut q, mut k) = (Vec::new(), Vec::new());
            for row in qk[rows.start * 2 * key_dim..rows.end * 2 * key_dim].chunks(2 * key_dim) {
                q.extend_from_slice(&row[..key_dim]);
                k.extend_from_slice(&row[key_dim..]);
            }
            let g: Vec<f32> = (rows.start * vh..rows.end * vh)
                .map(|i| neg_decay_rate[i % vh] * cpu::softplus(a[i] + dt_bias[i % vh]))
                .collect();
            let beta: Vec<f32> =
                b[rows.start * vh..rows.end * vh].iter().map(|&x| cpu::sigmoid(x)).collect();
            let inputs = cpu::DeltaInputs {
                q: &q,
                k: &k,
                v: &v[rows.start * s.value_dim()..rows.end * s.value_dim()],
                g: &g,
                beta: &beta,
            };
            let len = s.recurrent_state_len();
            let mut state = slot(&recurrent, run.slot, len).to_vec();
            let want = cpu::recurrent(&heads(s), &inputs, &mut state, &mut []);
            let what = format!("delta rule {s:?}, {} rows in slot {}", run.rows, run.slot);
            let got_rows = &got[rows.start * s.value_dim()..rows.end * s.value_dim()];
            check(&what, got_rows, &wide(&want), &at_least_one(&want), RULE_TOLERANCE);
            let got_state = slot(&got_states, run.slot, len);
            check(
                &format!("{what}: state"),
                got_state,
                &wide(&state),
                &at_least_one(&state),
                RULE_TOLERANCE,
            );
        }
    }
}

#[test]
fn the_gated_norm_matches_the_cpu() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(53);
    let norm = GatedRmsNorm::new(gpu).unwrap();
    for (rows, dim) in [(7 * 4, 16), (5 * 3, 13)] {
        let x = uniform(&mut rng, rows * dim);
        let z: Vec<f32> = uniform(&mut rng, rows * dim).iter().map(|v| v * 6.0).collect();
        let w: Vec<f32> = uniform(&mut rng, dim).iter().map(|v| v + 1.0).collect();
        let eps = 1e-6;
        let (xd, zd, wd) = (up(gpu, &x), up(gpu, &z), up(gpu, &w));
        let got = crate::harness::computed(gpu, |step| norm.forward(step, &xd, &zd, &wd, eps));
        let mut want = x.clone();
        cpu::gated_rms_norm(&mut want, &z, &w, eps);
        check(
            &format!("gated norm {rows}x{dim}"),
            &got,
            &wide(&want),
            &at_least_one(&want),
            GATED_NORM_TOLERANCE,
        );
    }
}

/// A layer's weights (random but as the fixtures' in kind), its host copies and device copies.
struct Layer {
    shape: DeltaNetShape,
    conv_weight: Vec<f32>,
    neg_decay_rate: Vec<f32>,
    dt_bias: Vec<f32>,
    norm_weight: Vec<f32>,
}

const EPS: f32 = 1e-6;

impl Layer {
    fn random(rng: &mut ChaCha8Rng, shape: DeltaNetShape) -> Layer {
        let conv_weight = uniform(rng, shape.conv_channels() * shape.conv_kernel);
        let (neg_decay_rate, dt_bias) = decay_weights(rng, shape);
        let norm_weight = uniform(rng, shape.v_dim).iter().map(|v| v + 1.0).collect();
        Layer { shape, conv_weight, neg_decay_rate, dt_bias, norm_weight }
    }

    fn cpu(&self) -> cpu::Mixing<'_> {
        cpu::Mixing {
            shape: cpu::DeltaNetShape {
                heads: heads(self.shape),
                conv_kernel: self.shape.conv_kernel,
                norm_eps: EPS as f64,
            },
            conv_weight: &self.conv_weight,
            neg_decay_rate: &self.neg_decay_rate,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_weight,
        }
    }

    fn on(&self, gpu: &Gpu) -> LinearAttentionWeights {
        let host = LinearAttentionHostWeights {
            conv_weight: &self.conv_weight,
            neg_decay_rate: &self.neg_decay_rate,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_weight,
            norm_eps: EPS,
        };
        LinearAttentionWeights::upload(gpu, self.shape, &host).unwrap()
    }
}

/// A step's in-projections for `tokens` rows, random.
struct Rows {
    qkv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
}

impl Rows {
    fn random(rng: &mut ChaCha8Rng, s: DeltaNetShape, tokens: usize) -> Rows {
        Rows {
            qkv: uniform(rng, tokens * s.conv_channels()),
            z: uniform(rng, tokens * s.value_dim()).iter().map(|v| v * 4.0).collect(),
            b: uniform(rng, tokens * s.v_heads).iter().map(|v| v * 3.0).collect(),
            a: uniform(rng, tokens * s.v_heads).iter().map(|v| v * 3.0).collect(),
        }
    }

    /// Rows `from..from + n`.
    fn part(&self, s: DeltaNetShape, from: usize, n: usize) -> Rows {
        let cut = |x: &[f32], w: usize| x[from * w..(from + n) * w].to_vec();
        Rows {
            qkv: cut(&self.qkv, s.conv_channels()),
            z: cut(&self.z, s.value_dim()),
            b: cut(&self.b, s.v_heads),
            a: cut(&self.a, s.v_heads),
        }
    }

    /// The layer's mixing part on the device, in one step over `runs`.
    fn mix_on(
        &self,
        gpu: &Gpu,
        layer: &LinearAttentionWeights,
        states: &LinearStates,
        runs: Vec<LinearRun>,
    ) -> Vec<f32> {
        let kernels = LinearAttention::new(gpu).unwrap();
        let runs = LinearRuns::upload(gpu, runs).unwrap();
        let (qkv, z, b, a) =
            (up(gpu, &self.qkv), up(gpu, &self.z), up(gpu, &self.b), up(gpu, &self.a));
        let x = Projected { qkv: &qkv, z: &z, b: &b, a: &a };
        crate::harness::computed(gpu, |step| kernels.forward(step, layer, &x, states, &runs))
    }
}

#[test]
fn a_layers_mixing_runs_two_sequences_in_one_batch_as_the_cpu_layer_runs_each() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(59);
    let layer = Layer::random(&mut rng, FIXTURE);
    let weights = layer.on(gpu);
    let s = FIXTURE;
    // Both from before their first token (the CPU's initial state), then a decode step each.
    let mut cpu_states = [s, s].map(|_| layer.cpu().shape.initial_state());
    let states = LinearStates::zeros(gpu, s, 2).unwrap();
    // Sequence 0: 3 then 1 rows, slot 1; sequence 1: 5 then 1 rows, slot 0.
    for (step, lengths) in [[3, 5], [1, 1]].into_iter().enumerate() {
        let rows = Rows::random(&mut rng, s, lengths.iter().sum());
        let batch = runs(&[(lengths[0], 1), (lengths[1], 0)]);
        let got = rows.mix_on(gpu, &weights, &states, batch.clone());
        let (conv, recurrent) =
            (gpu.download(&states.conv).unwrap(), gpu.download(&states.recurrent).unwrap());
        for (seq, run) in batch.iter().enumerate() {
            let part = rows.part(s, run.first_row, run.rows);
            let state = &mut cpu_states[seq];
            let want = layer.cpu().run(&part.qkv, &part.z, &part.b, &part.a, state);
            let what = format!("layer step {step}, sequence {seq} ({} rows)", run.rows);
            let got_rows = &got[run.first_row * s.value_dim()..][..run.rows * s.value_dim()];
            check(&what, got_rows, &wide(&want), &at_least_one(&want), LAYER_TOLERANCE);
            same_bits(
                &format!("{what}: window"),
                slot(&conv, run.slot, s.conv_state_len()),
                &state.conv,
            );
            let got_state = slot(&recurrent, run.slot, s.recurrent_state_len());
            let want_state = &state.recurrent;
            check(
                &format!("{what}: state"),
                got_state,
                &wide(want_state),
                &at_least_one(want_state),
                LAYER_TOLERANCE,
            );
        }
    }
}

#[test]
fn a_sequence_mixes_bitwise_the_same_alone_and_batched() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(61);
    for s in [DeltaNetShape { tiled: true, ..FIXTURE }, RAGGED] {
        let layer = Layer::random(&mut rng, s);
        let weights = layer.on(gpu);
        let (windows, recurrent) = random_states(&mut rng, s, 1);
        let (other_windows, other_recurrent) = random_states(&mut rng, s, 1);
        let (mine, others) = (Rows::random(&mut rng, s, 4), Rows::random(&mut rng, s, 3));
        let alone = LinearStates::upload(gpu, s, &windows, &recurrent).unwrap();
        let got_alone = mine.mix_on(gpu, &weights, &alone, runs(&[(4, 0)]));
        // Batched: the other sequence's rows first, and this one in slot 1.
        let together = LinearStates::upload(
            gpu,
            s,
            &[other_windows, windows].concat(),
            &[other_recurrent, recurrent].concat(),
        )
        .unwrap();
        let both = Rows {
            qkv: [others.qkv, mine.qkv].concat(),
            z: [others.z, mine.z].concat(),
            b: [others.b, mine.b].concat(),
            a: [others.a, mine.a].concat(),
        };
        let got_batched = both.mix_on(gpu, &weights, &together, runs(&[(3, 0), (4, 1)]));
        let what = format!("{s:?}");
        same_bits(&format!("{what}: outputs"), &got_alone, &got_batched[3 * s.value_dim()..]);
        let (conv_alone, conv_batched) =
            (gpu.download(&alone.conv).unwrap(), gpu.download(&together.conv).unwrap());
        same_bits(
            &format!("{what}: window"),
            &conv_alone,
            slot(&conv_batched, 1, s.conv_state_len()),
        );
        let rec_alone = gpu.download(&alone.recurrent).unwrap();
        let rec_batched = gpu.download(&together.recurrent).unwrap();
        same_bits(
            &format!("{what}: matrices"),
            &rec_alone,
            slot(&rec_batched, 1, s.recurrent_state_len()),
        );
    }
}

/// A run that verifies drafts (5 positions, beside a plain one) leaves its state after each
/// position but the last in history rows: each is bitwise the state of a run of only the
/// positions up to it, and restoring a row puts exactly that state in the slot. Keeping them
/// changes none of the outputs.
#[test]
fn a_verifying_run_keeps_each_positions_state_and_its_slot_goes_back_to_any() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut rng = rng(67);
    for s in [DeltaNetShape { tiled: true, ..FIXTURE }, RAGGED] {
        let layer = Layer::random(&mut rng, s);
        let weights = layer.on(gpu);
        let (windows, recurrent) = random_states(&mut rng, s, 2);
        let (mine, other) = (Rows::random(&mut rng, s, 5), Rows::random(&mut rng, s, 2));
        let both = Rows {
            qkv: [other.qkv.clone(), mine.qkv.clone()].concat(),
            z: [other.z.clone(), mine.z.clone()].concat(),
            b: [other.b.clone(), mine.b.clone()].concat(),
            a: [other.a.clone(), mine.a.clone()].concat(),
        };
        let mut kept = LinearStates::upload(gpu, s, &windows, &recurrent).unwrap();
        // Rows from 2 on: another pass's would come first.
        kept.keep_history(gpu, 2 + 4).unwrap();
        let mut batch = runs(&[(2, 0), (5, 1)]);
        batch[1].history = Some(2);
        let got = both.mix_on(gpu, &weights, &kept, batch);
        let plain = LinearStates::upload(gpu, s, &windows, &recurrent).unwrap();
        let want = both.mix_on(gpu, &weights, &plain, runs(&[(2, 0), (5, 1)]));
        same_bits(&format!("{s:?}: outputs keeping the states and not"), &got, &want);
        let conv_history = gpu.download(&kept.conv_history).unwrap();
        let recurrent_history = gpu.download(&kept.recurrent_history).unwrap();
        let (conv_len, matrices_len) = (s.conv_state_len(), s.recurrent_state_len());
        for position in 0..4 {
            let what = format!("{s:?}, after position {position}");
            let upto = LinearStates::upload(gpu, s, &windows, &recurrent).unwrap();
            mine.part(s, 0, position + 1).mix_on(gpu, &weights, &upto, runs(&[(position + 1, 1)]));
            let want_conv = gpu.download(&upto.conv).unwrap();
            let want_matrices = gpu.download(&upto.recurrent).unwrap();
            let (want_conv, want_matrices) =
                (slot(&want_conv, 1, conv_len), slot(&want_matrices, 1, matrices_len));
            let row = 2 + position;
            same_bits(
                &format!("{what}: kept window"),
                slot(&conv_history, row, conv_len),
                want_conv,
            );
            same_bits(
                &format!("{what}: kept matrices"),
                slot(&recurrent_history, row, matrices_len),
                want_matrices,
            );
            gpu.run(|step| kept.restore(step, row, 1)).unwrap();
            let (conv, matrices) =
                (gpu.download(&kept.conv).unwrap(), gpu.download(&kept.recurrent).unwrap());
            same_bits(&format!("{what}: window gone back"), slot(&conv, 1, conv_len), want_conv);
            same_bits(
                &format!("{what}: matrices gone back"),
                slot(&matrices, 1, matrices_len),
                want_matrices,
            );
        }
        // Rows past the history are refused before anything runs.
        let mut past = runs(&[(5, 1)]);
        past[0].history = Some(3);
        let runs = LinearRuns::upload(gpu, past).unwrap();
        let kernels = LinearAttention::new(gpu).unwrap();
        let (qkv, z, b, a) =
            (up(gpu, &mine.qkv), up(gpu, &mine.z), up(gpu, &mine.b), up(gpu, &mine.a));
        let x = Projected { qkv: &qkv, z: &z, b: &b, a: &a };
        let refused = gpu.run(|step| kernels.forward(step, &weights, &x, &kept, &runs).map(|_| ()));
        assert!(refused.is_err(), "history rows 3..7 of 6 were accepted");
        assert!(gpu.run(|step| kept.restore(step, 6, 1)).is_err(), "row 6 of 6 restored");
    }
}
