//! The gated delta rule of Gated DeltaNet linear attention, on plain f32 slices, in its two
//! forms: the recurrent one (one token at a time, for decode) and the chunked one (a chunk of
//! tokens at once through a small triangular solve, for prefill). Both read and write the same
//! explicit state, so a prompt can be prefilled in chunks, decoded token by token, snapshotted
//! and resumed, and the two forms must agree (tested below).
//!
//! Per value head the state is a `k_dim × v_dim` matrix `S`. For each token, with `q` and `k`
//! L2-normalised (and `q` scaled by `1/√k_dim`), decay `g ≤ 0` and write strength `β`:
//! `S ← e^g S;  S ← S + k ⊗ β (v − Sᵀk);  o = Sᵀq`.

use rayon::prelude::*;

use crate::small_matmul::product_add;

/// Head layout of one linear-attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaHeads {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// How value heads map to key heads when there are more of them: HF checkpoints group
    /// them (value head `j` reads key head `j / (v_heads / k_heads)`); llama.cpp's Qwen3.5 GGUFs
    /// tile them (key head `j mod k_heads`).
    pub tiled: bool,
}

impl DeltaHeads {
    fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }

    /// The key head a value head reads.
    fn k_head_of(&self, v_head: usize) -> usize {
        if self.tiled {
            v_head % self.k_heads
        } else {
            v_head / (self.v_heads / self.k_heads)
        }
    }
}

/// One sequence's inputs to the rule for `t` tokens, token-major:
/// `q`, `k`: `t × k_heads × k_dim` (already normalised and scaled); `v`: `t × v_heads × v_dim`;
/// `g`, `beta`: `t × v_heads`.
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

/// Tokens per chunk in the chunked form (as in transformers and FLA).
pub const CHUNK: usize = 64;

/// A fresh (zero) state for `heads`.
pub fn zero_state(heads: &DeltaHeads) -> Vec<f32> {
    vec![0.0; heads.state_len()]
}

/// Runs `t` tokens one at a time, updating `state`; returns the outputs, `t × v_heads × v_dim`.
/// `kept[i]`, for as many positions as it has slots, receives the state after position `i`.
pub fn recurrent(
    heads: &DeltaHeads,
    x: &DeltaInputs,
    state: &mut [f32],
    kept: &mut [Vec<f32>],
) -> Vec<f32> {
    let DeltaHeads { k_heads, v_heads, k_dim, v_dim, .. } = *heads;
    let kh_of = |h| heads.k_head_of(h);
    // Each head writes its own part of every slot.
    let mut kept_by_head: Vec<Vec<&mut [f32]>> = (0..v_heads).map(|_| Vec::new()).collect();
    for slot in kept.iter_mut() {
        for (head, part) in kept_by_head.iter_mut().zip(slot.chunks_exact_mut(k_dim * v_dim)) {
            head.push(part);
        }
    }
    each_head(heads, x.g.len() / v_heads, state, kept_by_head, |h, s, out, mut kept| {
        let kh = kh_of(h);
        let mut delta = vec![0.0; v_dim];
        for (pos, o) in out.chunks_exact_mut(v_dim).enumerate() {
            let q = &x.q[(pos * k_heads + kh) * k_dim..][..k_dim];
            let k = &x.k[(pos * k_heads + kh) * k_dim..][..k_dim];
            let v = &x.v[(pos * v_heads + h) * v_dim..][..v_dim];
            let (decay, beta) = (x.g[pos * v_heads + h].exp(), x.beta[pos * v_heads + h]);
            s.iter_mut().for_each(|e| *e *= decay);
            // delta = β (v − Sᵀk)
            delta.copy_from_slice(v);
            for (row, &kd) in s.chunks_exact(v_dim).zip(k) {
                delta.iter_mut().zip(row).for_each(|(d, &e)| *d -= e * kd);
            }
            delta.iter_mut().for_each(|d| *d *= beta);
            for ((row, &kd), &qd) in s.chunks_exact_mut(v_dim).zip(k).zip(q) {
                row.iter_mut().zip(&delta).for_each(|(e, &d)| *e += kd * d);
                o.iter_mut().zip(row.iter()).for_each(|(o, &e)| *o += e * qd);
            }
            if let Some(slot) = kept.get_mut(pos) {
                slot.copy_from_slice(s);
            }
        }
    })
}

/// Runs `t` tokens in chunks of [`CHUNK`], updating `state`; the same result as [`recurrent`]
/// up to rounding, with most of the work in dense chunk-sized products.
pub fn chunked(heads: &DeltaHeads, x: &DeltaInputs, state: &mut [f32]) -> Vec<f32> {
    let t = x.g.len() / heads.v_heads;
    let nothing_kept = vec![(); heads.v_heads];
    each_head(heads, t, state, nothing_kept, |h, s, out, ()| {
        for start in (0..t).step_by(CHUNK) {
            chunk_head(heads, x, h, start, CHUNK.min(t - start), s, out);
        }
    })
}

/// Runs `head(h, state of h, outputs of h, extra[h])` for every value head in parallel (heads
/// are independent; each has its own state and a head-major `t × v_dim` output), then
/// interleaves the outputs token-major: the same arithmetic whatever the split.
fn each_head<T: Send>(
    heads: &DeltaHeads,
    t: usize,
    state: &mut [f32],
    extra: Vec<T>,
    head: impl Fn(usize, &mut [f32], &mut [f32], T) + Sync,
) -> Vec<f32> {
    let DeltaHeads { v_heads, k_dim, v_dim, .. } = *heads;
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(k_dim * v_dim)
        .zip(extra)
        .enumerate()
        .map(|(h, (head_state, extra))| {
            let mut head_out = vec![0.0; t * v_dim];
            head(h, head_state, &mut head_out, extra);
            head_out
        })
        .collect();
    let mut out = vec![0.0; t * v_heads * v_dim];
    for (h, head_out) in per_head.iter().enumerate() {
        for (pos, row) in head_out.chunks_exact(v_dim).enumerate() {
            out[(pos * v_heads + h) * v_dim..][..v_dim].copy_from_slice(row);
        }
    }
    out
}

/// One value head over tokens `start..start+len`. Within the chunk, with `c_i` the cumulative
/// log decay and `L` the strictly lower matrix `L_ij = β_i (k_i·k_j) e^{c_i−c_j}`, the delta
/// rule's writes are `u = (I+L)⁻¹ (βv − β e^{c} k S₀)`; outputs read the decayed old state plus
/// the chunk's own writes, and the state moves on by the whole chunk at once. The products run
/// through [`product_add`], so they are vectorised and round the same on every CPU.
/// `s0` is the head's state; `out` its outputs, `t × v_dim`.
fn chunk_head(
    heads: &DeltaHeads,
    x: &DeltaInputs,
    h: usize,
    start: usize,
    len: usize,
    s0: &mut [f32],
    out: &mut [f32],
) {
    let DeltaHeads { k_heads, v_heads, k_dim, v_dim, .. } = *heads;
    let kh = heads.k_head_of(h);
    // This head's rows of the chunk, contiguous.
    let rows = |m: &[f32], width: usize, n_heads: usize, head: usize| -> Vec<f32> {
        (0..len)
            .flat_map(|i| m[((start + i) * n_heads + head) * width..][..width].iter().copied())
            .collect()
    };
    let (q, k, v) = (
        rows(x.q, k_dim, k_heads, kh),
        rows(x.k, k_dim, k_heads, kh),
        rows(x.v, v_dim, v_heads, h),
    );
    let beta: Vec<f32> = (0..len).map(|i| x.beta[(start + i) * v_heads + h]).collect();
    let mut cum = vec![0.0f32; len];
    let mut acc = 0.0;
    for (i, c) in cum.iter_mut().enumerate() {
        acc += x.g[(start + i) * v_heads + h];
        *c = acc;
    }
    let mut k_t = vec![0.0f32; k_dim * len];
    for (i, row) in k.chunks_exact(k_dim).enumerate() {
        row.iter().enumerate().for_each(|(d, &e)| k_t[d * len + i] = e);
    }
    // Dot products within the chunk (k_i·k_j, q_i·k_j) and reads of the old state (S₀ᵀk_i, S₀ᵀq_i).
    let product = |a: &[f32], b: &[f32], cols: usize| {
        let mut c = vec![0.0f32; len * cols];
        product_add(&mut c, &matrix_entries(a, k_dim), b, len, k_dim, cols);
        c
    };
    let (kk, qk) = (product(&k, &k_t, len), product(&q, &k_t, len));
    let (ks, qs) = (product(&k, s0, v_dim), product(&q, s0, v_dim));
    // u_i = β_i (v_i − e^{c_i} S₀ᵀk_i) − Σ_{j<i} L_ij u_j, by forward substitution.
    let mut u = vec![0.0f32; len * v_dim];
    for i in 0..len {
        let read = cum[i].exp();
        let (done, rest) = u.split_at_mut(i * v_dim);
        let ui = &mut rest[..v_dim];
        for (c, o) in ui.iter_mut().enumerate() {
            *o = beta[i] * (v[i * v_dim + c] - read * ks[i * v_dim + c]);
        }
        let minus_l: Vec<f32> =
            (0..i).map(|j| -beta[i] * kk[i * len + j] * (cum[i] - cum[j]).exp()).collect();
        product_add(ui, &|_, j| minus_l[j], done, 1, i, v_dim);
    }
    // o_i = e^{c_i} S₀ᵀq_i + Σ_{j≤i} (q_i·k_j) e^{c_i−c_j} u_j
    let o = &mut out[start * v_dim..][..len * v_dim];
    for (i, row) in o.chunks_exact_mut(v_dim).enumerate() {
        let read = cum[i].exp();
        row.iter_mut().zip(&qs[i * v_dim..][..v_dim]).for_each(|(o, &e)| *o = read * e);
    }
    let attend: Vec<f32> = (0..len * len)
        .map(|ij| {
            if ij % len <= ij / len {
                qk[ij] * (cum[ij / len] - cum[ij % len]).exp()
            } else {
                0.0
            }
        })
        .collect();
    product_add(o, &|i, j| attend[i * len + j], &u, len, len, v_dim);
    // S = e^{c_last} S₀ + Σ_j e^{c_last−c_j} k_j ⊗ u_j
    let last = cum[len - 1];
    s0.iter_mut().for_each(|e| *e *= last.exp());
    for (j, row) in u.chunks_exact_mut(v_dim).enumerate() {
        let w = (last - cum[j]).exp();
        row.iter_mut().for_each(|e| *e *= w);
    }
    product_add(s0, &|d, j| k_t[d * len + j], &u, k_dim, len, v_dim);
}

/// Entry `(i, j)` of the row-major matrix `m` with rows of `width`.
fn matrix_entries(m: &[f32], width: usize) -> impl Fn(usize, usize) -> f32 + '_ {
    move |i, j| m[i * width + j]
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    struct Owned {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
    }

    impl Owned {
        fn inputs(&self) -> DeltaInputs<'_> {
            DeltaInputs { q: &self.q, k: &self.k, v: &self.v, g: &self.g, beta: &self.beta }
        }

        fn slice(&self, heads: &DeltaHeads, from: usize, to: usize) -> Owned {
            let kk = heads.k_heads * heads.k_dim;
            let vv = heads.v_heads * heads.v_dim;
            let hh = heads.v_heads;
            Owned {
                q: self.q[from * kk..to * kk].to_vec(),
                k: self.k[from * kk..to * kk].to_vec(),
                v: self.v[from * vv..to * vv].to_vec(),
                g: self.g[from * hh..to * hh].to_vec(),
                beta: self.beta[from * hh..to * hh].to_vec(),
            }
        }
    }

    /// Random inputs shaped like the model's: unit-norm keys, scaled unit-norm queries,
    /// decays in (−2, 0), β in (0, 1).
    fn random(heads: &DeltaHeads, t: usize, seed: u64) -> Owned {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut unit = |n: usize, scale: f32| -> Vec<f32> {
            let mut x: Vec<f32> = (0..t * n).map(|_| rng.random_range(-1.0..1.0)).collect();
            for row in x.chunks_exact_mut(heads.k_dim) {
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                row.iter_mut().for_each(|v| *v *= scale / norm);
            }
            x
        };
        let q = unit(heads.k_heads * heads.k_dim, 1.0 / (heads.k_dim as f32).sqrt());
        let k = unit(heads.k_heads * heads.k_dim, 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
        let n = t * heads.v_heads;
        Owned {
            q,
            k,
            v: (0..t * heads.v_heads * heads.v_dim).map(|_| rng.random_range(-1.0..1.0)).collect(),
            g: (0..n).map(|_| rng.random_range(-2.0..0.0)).collect(),
            beta: (0..n).map(|_| rng.random_range(0.0..1.0)).collect(),
        }
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    const HEADS: DeltaHeads =
        DeltaHeads { k_heads: 2, v_heads: 4, k_dim: 16, v_dim: 8, tiled: false };

    #[test]
    fn chunked_and_recurrent_forms_agree_across_chunk_boundaries() {
        for t in [1, 5, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 17] {
            let x = random(&HEADS, t, t as u64);
            let (mut s1, mut s2) = (zero_state(&HEADS), zero_state(&HEADS));
            let a = recurrent(&HEADS, &x.inputs(), &mut s1, &mut []);
            let b = chunked(&HEADS, &x.inputs(), &mut s2);
            assert!(max_diff(&a, &b) < 1e-4, "t={t}: outputs differ by {}", max_diff(&a, &b));
            assert!(max_diff(&s1, &s2) < 1e-4, "t={t}: states differ by {}", max_diff(&s1, &s2));
            assert!(a.iter().any(|v| v.abs() > 1e-2), "t={t}: trivial outputs");
        }
    }

    #[test]
    fn wide_heads_agree_too() {
        // Widths that fill whole register tiles and leave partial ones.
        let heads = DeltaHeads { k_heads: 1, v_heads: 2, k_dim: 48, v_dim: 40, tiled: false };
        let t = CHUNK + 9;
        let x = random(&heads, t, 5);
        let (mut s1, mut s2) = (zero_state(&heads), zero_state(&heads));
        let a = recurrent(&heads, &x.inputs(), &mut s1, &mut []);
        let b = chunked(&heads, &x.inputs(), &mut s2);
        assert!(max_diff(&a, &b) < 1e-4, "outputs differ by {}", max_diff(&a, &b));
        assert!(max_diff(&s1, &s2) < 1e-4, "states differ by {}", max_diff(&s1, &s2));
    }

    #[test]
    fn tiled_value_heads_read_key_heads_round_robin() {
        let grouped = DeltaHeads { k_heads: 2, v_heads: 6, k_dim: 1, v_dim: 1, tiled: false };
        let tiled = DeltaHeads { tiled: true, ..grouped };
        assert_eq!(
            (0..6).map(|h| grouped.k_head_of(h)).collect::<Vec<_>>(),
            vec![0, 0, 0, 1, 1, 1]
        );
        assert_eq!((0..6).map(|h| tiled.k_head_of(h)).collect::<Vec<_>>(), vec![0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn splitting_the_sequence_anywhere_gives_the_same_outputs() {
        let t = 90;
        let x = random(&HEADS, t, 42);
        let mut whole = zero_state(&HEADS);
        let expected = chunked(&HEADS, &x.inputs(), &mut whole);
        for cut in [1, 30, 64, 89] {
            let mut state = zero_state(&HEADS);
            let mut out = chunked(&HEADS, &x.slice(&HEADS, 0, cut).inputs(), &mut state);
            // Resume from a copy of the state, as a prefix-cache snapshot would.
            let mut resumed = state.clone();
            out.extend(recurrent(&HEADS, &x.slice(&HEADS, cut, t).inputs(), &mut resumed, &mut []));
            assert!(max_diff(&out, &expected) < 1e-4, "cut {cut}");
            assert!(max_diff(&resumed, &whole) < 1e-4, "cut {cut}");
        }
    }

    #[test]
    fn the_states_kept_after_each_position_are_those_of_running_that_far() {
        let t = 7;
        let x = random(&HEADS, t, 9);
        let start: Vec<f32> =
            random(&HEADS, 1, 3).v.iter().cycle().take(HEADS.state_len()).copied().collect();
        let mut state = start.clone();
        let mut kept = vec![zero_state(&HEADS); t - 1];
        let outputs = recurrent(&HEADS, &x.inputs(), &mut state, &mut kept);
        let mut one_by_one = start;
        for pos in 0..t {
            let out = recurrent(
                &HEADS,
                &x.slice(&HEADS, pos, pos + 1).inputs(),
                &mut one_by_one,
                &mut [],
            );
            let width = HEADS.v_heads * HEADS.v_dim;
            assert_eq!(out, outputs[pos * width..][..width], "position {pos}: outputs");
            let after = kept.get(pos).unwrap_or(&state);
            assert_eq!(after, &one_by_one, "position {pos}: state");
        }
    }

    #[test]
    fn a_single_token_follows_the_definition() {
        let heads = DeltaHeads { k_heads: 1, v_heads: 1, k_dim: 2, v_dim: 1, tiled: false };
        let mut state = vec![1.0, 2.0]; // S = [[1], [2]]
        let x = Owned {
            q: vec![1.0, 0.0],
            k: vec![0.0, 1.0],
            v: vec![5.0],
            g: vec![(0.5f32).ln()],
            beta: vec![0.5],
        };
        let out = recurrent(&heads, &x.inputs(), &mut state, &mut []);
        // Decay: S = [[0.5], [1]]; Sᵀk = 1; delta = 0.5 (5 − 1) = 2; S = [[0.5], [3]]; o = Sᵀq = 0.5.
        assert_eq!(state, vec![0.5, 3.0]);
        assert_eq!(out, vec![0.5]);
    }
}
