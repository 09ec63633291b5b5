//! Qwen3-Next / Qwen3.5 / Qwen3.6 hybrid decoder (HF `modeling_qwen3_next.py`,
//! `modeling_qwen3_5_moe.py`): layers mix tokens either with Gated DeltaNet linear attention or
//! with gated full attention (typically three linear layers, then one full), and feed forward
//! through a sparse MoE with a shared expert (or a dense MLP). Every norm outside the DeltaNet
//! is zero-centred (`x·(1+w)`).
//!
//! Per layer: `x += mixer(norm(x))`, then `x += ffn(norm(x))`.

mod attention;
mod config;
mod first_blocks;
mod gguf;
mod mtp;

use candle_core::{Device, Tensor};

use crate::activation::Activation;
use crate::cache::RecurrentState;
use crate::config::{Architecture, TransformerConfig};
use crate::error::Result;
use crate::gated_deltanet::GatedDeltaNet;
use crate::layers::{self, GatedMlp, RmsNorm, RopeStyle, Rotary};
use crate::linear::{Embedding, Linear};
use crate::moe::SparseMoe;
use crate::paged_kv::KvShape;
use crate::projections::Projections;
use crate::weight::Weight;
use crate::weights::SafetensorsWeights;
use crate::{advance_all, batch_rows, logit_rows, BatchEntry, CausalLm, DraftHead, RowRange};
use attention::GatedAttention;
pub use config::{HybridConfig, Mixer};
pub use first_blocks::HybridFirstBlocks;
pub use gguf::{gguf_experts, ARCHITECTURES as GGUF_ARCHITECTURES};

enum TokenMixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

enum FeedForward {
    Moe(Box<SparseMoe>),
    Dense(GatedMlp),
}

impl FeedForward {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Moe(moe) => moe.forward(x),
            Self::Dense(mlp) => mlp.forward(x),
        }
    }
}

struct Layer {
    input_norm: RmsNorm,
    mixer: TokenMixer,
    post_attention_norm: RmsNorm,
    ffn: FeedForward,
}

pub struct Qwen3Next {
    /// The dense-model view of the sizes, for [`CausalLm::config`].
    summary: TransformerConfig,
    cfg: HybridConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    head: Linear,
    rotary: Rotary,
    /// The multi-token-prediction head, when the checkpoint carries one.
    mtp: Option<mtp::MtpHead>,
}

impl Qwen3Next {
    pub fn load_safetensors(cfg: HybridConfig, w: &SafetensorsWeights) -> Result<Self> {
        let eps = cfg.rms_norm_eps;
        let norm = |name: &str| RmsNorm::new_offset_by_one(w.model_tensor(name)?, eps);
        let linear = |name: &str| dense_linear(w.model_tensor(name)?);
        let layers = cfg
            .layer_types()
            .into_iter()
            .enumerate()
            .map(|(i, kind)| load_layer(&cfg, w, &format!("layers.{i}"), kind, cfg.is_moe_layer(i)))
            .collect::<Result<Vec<_>>>()?;
        let table = w.model_tensor("embed_tokens.weight")?;
        let head = if !cfg.tie_word_embeddings && w.has_model_tensor("lm_head.weight") {
            linear("lm_head.weight")?
        } else {
            dense_linear(table.clone())?
        };
        Ok(Self {
            mtp: mtp::MtpHead::from_safetensors(&cfg, w)?,
            rotary: Rotary::new(
                cfg.rotary_dim(),
                cfg.rope_theta(),
                &cfg.rope_scaling,
                RopeStyle::Halves,
            ),
            embed: Embedding::new(Weight::Dense(table))?,
            norm: norm("norm.weight")?,
            head,
            layers,
            summary: cfg.summary(),
            cfg,
        })
    }
}

impl CausalLm for Qwen3Next {
    fn config(&self) -> &TransformerConfig {
        &self.summary
    }

    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> Result<Vec<Vec<f32>>> {
        let (rows, ids) = batch_rows(batch)?;
        let x = self.embed.forward(&ids)?;
        let x = run_blocks(&self.layers, x, &self.rotary, batch, &rows)?;
        advance_all(batch);
        self.keep_hidden_states(&x, batch, &rows)?;
        layers::logits_of_rows(&x, &logit_rows(batch, &rows), &self.norm, &self.head)
    }

    fn draft_head(&self) -> Option<&dyn DraftHead> {
        self.mtp.as_ref().map(|_| self as &dyn DraftHead)
    }

    fn kv_shapes(&self) -> Vec<Option<KvShape>> {
        let shape = KvShape {
            kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
            window: None,
        };
        self.cfg
            .layer_types()
            .into_iter()
            .map(|kind| (kind == Mixer::Full).then_some(shape))
            .collect()
    }

    fn initial_recurrent_state(&self) -> RecurrentState {
        self.cfg.initial_recurrent_state()
    }
}

/// Runs the residual stream `x` of `batch`'s rows through `layers`, blocks `0..layers.len()`,
/// moving on their keys, values and states in the entries' caches.
fn run_blocks(
    layers: &[Layer],
    mut x: Tensor,
    rotary: &Rotary,
    batch: &mut [BatchEntry<'_>],
    rows: &[RowRange],
) -> Result<Tensor> {
    for (i, layer) in layers.iter().enumerate() {
        let h = layer.input_norm.forward(&x)?;
        let mixed = match &layer.mixer {
            TokenMixer::Linear(net) => {
                let mut states = batch
                    .iter_mut()
                    .map(|e| {
                        let verifying = e.verifies();
                        e.cache.linear_run(i, verifying)
                    })
                    .collect::<Result<Vec<_>>>()?;
                net.forward(&h, rows, &mut states)?
            }
            TokenMixer::Full(attn) => attn.forward(&h, i, rotary, batch, rows)?,
        };
        x = (x + mixed)?;
        x = (&x + layer.ffn.forward(&layer.post_attention_norm.forward(&x)?)?)?;
    }
    Ok(x)
}

impl Qwen3Next {
    /// Hands each entry whose cache asks for them the final hidden states of its rows.
    fn keep_hidden_states(
        &self,
        x: &Tensor,
        batch: &mut [BatchEntry<'_>],
        rows: &[RowRange],
    ) -> Result<()> {
        for (entry, &(first, len)) in batch.iter_mut().zip(rows) {
            if entry.cache.wants_hidden_states() {
                let normed = self.norm.forward(&x.narrow(0, first, len)?)?;
                entry.cache.set_hidden_states(normed.flatten_all()?.to_vec1()?, len);
            }
        }
        Ok(())
    }
}

impl HybridConfig {
    /// The dense-model view of the sizes, for [`CausalLm::config`].
    pub fn summary(&self) -> TransformerConfig {
        let cfg = self;
        TransformerConfig {
            architecture: Architecture::Qwen3Next,
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            intermediate_size: cfg.intermediate_size.unwrap_or(cfg.moe_intermediate_size),
            num_hidden_layers: cfg.num_hidden_layers,
            num_attention_heads: cfg.num_attention_heads,
            num_key_value_heads: Some(cfg.num_key_value_heads),
            head_dim: Some(cfg.head_dim),
            rms_norm_eps: cfg.rms_norm_eps,
            rope_theta: cfg.rope_theta(),
            rope_local_base_freq: cfg.rope_theta(),
            rope_scaling: cfg.rope_scaling.clone(),
            max_position_embeddings: cfg.max_position_embeddings,
            sliding_window: None,
            sliding_window_pattern: 1,
            query_pre_attn_scalar: None,
            tie_word_embeddings: cfg.tie_word_embeddings,
        }
    }
}

/// Decoder layer at `p` (`layers.3`).
fn load_layer(
    cfg: &HybridConfig,
    w: &SafetensorsWeights,
    p: &str,
    kind: Mixer,
    moe: bool,
) -> Result<Layer> {
    let norm = |name: &str| {
        RmsNorm::new_offset_by_one(w.model_tensor(&format!("{p}.{name}.weight"))?, cfg.rms_norm_eps)
    };
    let mixer = match kind {
        Mixer::Linear => TokenMixer::Linear(load_delta_net(cfg, w, &format!("{p}.linear_attn"))?),
        Mixer::Full => TokenMixer::Full(load_attention(cfg, w, &format!("{p}.self_attn"))?),
    };
    Ok(Layer {
        input_norm: norm("input_layernorm")?,
        mixer,
        post_attention_norm: norm("post_attention_layernorm")?,
        ffn: load_ffn(cfg, w, &format!("{p}.mlp"), moe)?,
    })
}

/// The gated full attention at `p` (`layers.3.self_attn`).
fn load_attention(cfg: &HybridConfig, w: &SafetensorsWeights, p: &str) -> Result<GatedAttention> {
    let norm = |name: &str| {
        RmsNorm::new_offset_by_one(w.model_tensor(&format!("{p}.{name}.weight"))?, cfg.rms_norm_eps)
    };
    let linear = |name: &str| dense_linear(w.model_tensor(&format!("{p}.{name}.weight"))?);
    Ok(GatedAttention {
        q_and_gate: linear("q_proj")?,
        k: linear("k_proj")?,
        v: linear("v_proj")?,
        o: linear("o_proj")?,
        q_norm: norm("q_norm")?,
        k_norm: norm("k_norm")?,
        heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        rotary_dim: cfg.rotary_dim(),
    })
}

/// The MoE block or dense MLP at `p` (`layers.3.mlp`).
fn load_ffn(cfg: &HybridConfig, w: &SafetensorsWeights, p: &str, moe: bool) -> Result<FeedForward> {
    Ok(if moe {
        FeedForward::Moe(Box::new(load_moe(cfg, w, p)?))
    } else {
        FeedForward::Dense(mlp(w, p)?)
    })
}

fn dense_linear(weight: Tensor) -> Result<Linear> {
    Linear::new(Weight::Dense(weight), None)
}

fn mlp(w: &SafetensorsWeights, p: &str) -> Result<GatedMlp> {
    let linear = |name: &str| dense_linear(w.model_tensor(&format!("{p}.{name}.weight"))?);
    let weight = |name: &str| -> Result<Weight> {
        Ok(Weight::Dense(w.model_tensor(&format!("{p}.{name}.weight"))?))
    };
    GatedMlp::new(weight("gate_proj")?, weight("up_proj")?, linear("down_proj")?, Activation::Silu)
}

fn load_moe(cfg: &HybridConfig, w: &SafetensorsWeights, p: &str) -> Result<SparseMoe> {
    // No capacity from the config: a damaged expert count would be allocated before the first
    // missing expert is found.
    let mut experts = Vec::new();
    if w.has_model_tensor(&format!("{p}.experts.gate_up_proj")) {
        // transformers ≥ 5: all experts in two 3-D tensors.
        let gate_up = w.model_tensor(&format!("{p}.experts.gate_up_proj"))?;
        let down = w.model_tensor(&format!("{p}.experts.down_proj"))?;
        for e in 0..cfg.num_experts {
            let (both, width) = (gate_up.get(e)?, gate_up.dim(1)? / 2);
            let (gate, up) = (
                Weight::Dense(both.narrow(0, 0, width)?),
                Weight::Dense(both.narrow(0, width, width)?),
            );
            experts.push(GatedMlp::new(gate, up, dense_linear(down.get(e)?)?, Activation::Silu)?);
        }
    } else {
        // Released checkpoints: one module per expert.
        for e in 0..cfg.num_experts {
            let t = |name: &str| w.model_tensor(&format!("{p}.experts.{e}.{name}.weight"));
            let (gate, up) = (Weight::Dense(t("gate_proj")?), Weight::Dense(t("up_proj")?));
            experts.push(GatedMlp::new(
                gate,
                up,
                dense_linear(t("down_proj")?)?,
                Activation::Silu,
            )?);
        }
    }
    Ok(SparseMoe {
        router: dense_linear(w.model_tensor(&format!("{p}.gate.weight"))?)?,
        experts,
        top_k: cfg.num_experts_per_tok,
        normalize_top_k: cfg.normalize_top_k(),
        shared: mlp(w, &format!("{p}.shared_expert"))?,
        shared_gate: dense_linear(w.model_tensor(&format!("{p}.shared_expert_gate.weight"))?)?,
    })
}

fn load_delta_net(cfg: &HybridConfig, w: &SafetensorsWeights, p: &str) -> Result<GatedDeltaNet> {
    let shape = cfg.delta_net_shape();
    let t = |name: &str| w.model_tensor(&format!("{p}.{name}"));
    let (in_qkv, in_z, in_b, in_a) = if cfg.fused_in_projections() {
        split_fused_projections(cfg, &t("in_proj_qkvz.weight")?, &t("in_proj_ba.weight")?)?
    } else {
        (
            t("in_proj_qkv.weight")?,
            t("in_proj_z.weight")?,
            t("in_proj_b.weight")?,
            t("in_proj_a.weight")?,
        )
    };
    let a_log: Vec<f32> = t("A_log")?.to_vec1()?;
    GatedDeltaNet {
        shape,
        in_proj: Projections::new([in_qkv, in_z, in_b, in_a].map(Weight::Dense).into())?,
        // (channels, 1, kernel) → channels × kernel
        conv_weight: t("conv1d.weight")?.flatten_all()?.to_vec1()?,
        neg_decay_rate: a_log.iter().map(|a| -a.exp()).collect(),
        dt_bias: t("dt_bias")?.to_vec1()?,
        norm_weight: t("norm.weight")?.to_vec1()?,
        out: dense_linear(t("out_proj.weight")?)?,
    }
    .checked()
}

/// Qwen3-Next's fused rows are grouped per key head: `[q, k, v…, z…]` and `[b…, a…]`, with
/// `v_heads / k_heads` value heads per group. Regroup them into q of all heads, k of all
/// heads, v of all heads (the convolution's channel order), and z, b, a.
fn split_fused_projections(
    cfg: &HybridConfig,
    qkvz: &Tensor,
    ba: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let h = cfg.delta_net_shape().heads;
    let per_group = h.v_heads / h.k_heads;
    let (dk, vz) = (h.k_dim, per_group * h.v_dim);
    let group = 2 * dk + 2 * vz;
    let rows = |offset: usize, len: usize, stride: usize| -> Result<Tensor> {
        let ids: Vec<u32> = (0..h.k_heads)
            .flat_map(|g| (0..len).map(move |r| (g * stride + offset + r) as u32))
            .collect();
        let n = ids.len();
        Ok(Tensor::from_vec(ids, n, &Device::Cpu)?)
    };
    let q = qkvz.index_select(&rows(0, dk, group)?, 0)?;
    let k = qkvz.index_select(&rows(dk, dk, group)?, 0)?;
    let v = qkvz.index_select(&rows(2 * dk, vz, group)?, 0)?;
    let z = qkvz.index_select(&rows(2 * dk + vz, vz, group)?, 0)?;
    let b = ba.index_select(&rows(0, per_group, 2 * per_group)?, 0)?;
    let a = ba.index_select(&rows(per_group, per_group, 2 * per_group)?, 0)?;
    Ok((Tensor::cat(&[q, k, v], 0)?, z, b, a))
}
