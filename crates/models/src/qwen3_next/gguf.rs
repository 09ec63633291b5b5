//! Building the hybrid model from a llama.cpp GGUF (`qwen3next`, `qwen35moe`, `qwen35`), as its
//! converter writes them (scripts/reference/hybrid/README.md lists every transformation): norm
//! weights already hold `1 + w`, `ssm_a` holds `-exp(A_log)`, experts are stacked 3-D tensors with
//! gate and up apart, Qwen3.5 files tile their value heads, and Qwen3-Next keeps `ssm_ba` grouped
//! per key head. Quantized weights stay quantized.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use candle_core::{Device, Tensor};

use super::attention::GatedAttention;
use super::mtp::{self, MtpHead};
use super::{FeedForward, HybridConfig, Layer, Mixer, Qwen3Next, TokenMixer};
use crate::activation::Activation;
use crate::error::Result;
use crate::gated_deltanet::GatedDeltaNet;
use crate::layers::{GatedMlp, RmsNorm, RopeStyle, Rotary};
use crate::linear::Linear;
use crate::moe::SparseMoe;
use crate::projections::Projections;
use crate::weight::Weight;
use crate::weights::WeightSource;

/// The GGUF `general.architecture` names of the family.
pub const ARCHITECTURES: [&str; 3] = ["qwen3next", "qwen35moe", "qwen35"];

impl Qwen3Next {
    pub fn load_gguf(w: &mut WeightSource, meta: &HashMap<String, Value>) -> Result<Self> {
        let (embed, head) = w.embedding_and_head()?;
        let tied = !w.contains("output.weight");
        let vocab = embed.vocab_size()?;
        let cfg = HybridConfig::from_gguf(meta, vocab, tied)?;
        let layers = cfg
            .layer_types()
            .into_iter()
            .enumerate()
            .map(|(i, kind)| layer(&cfg, w, i, kind))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            mtp: mtp_head(&cfg, w)?,
            rotary: Rotary::new(
                cfg.rotary_dim(),
                cfg.rope_theta(),
                &cfg.rope_scaling,
                RopeStyle::Halves,
            ),
            norm: norm(&cfg, w, "output_norm")?,
            embed,
            head,
            layers,
            summary: cfg.summary(),
            cfg,
        })
    }
}

pub(super) fn layer(
    cfg: &HybridConfig,
    w: &mut WeightSource,
    i: usize,
    kind: Mixer,
) -> Result<Layer> {
    let p = format!("blk.{i}");
    let mixer = match kind {
        Mixer::Full => TokenMixer::Full(attention(cfg, w, &p)?),
        Mixer::Linear => TokenMixer::Linear(delta_net(cfg, w, &p)?),
    };
    Ok(Layer {
        input_norm: norm(cfg, w, &format!("{p}.attn_norm"))?,
        mixer,
        post_attention_norm: norm(cfg, w, &format!("{p}.post_attention_norm"))?,
        ffn: ffn(cfg, w, &p, cfg.is_moe_layer(i))?,
    })
}

/// A norm whose weights already hold `1 + w` (`blk.3.attn_norm`).
pub(super) fn norm(cfg: &HybridConfig, w: &mut WeightSource, name: &str) -> Result<RmsNorm> {
    Ok(RmsNorm::new(w.dense(&format!("{name}.weight"))?, cfg.rms_norm_eps))
}

/// The gated full attention of block `p` (`blk.3`).
pub(super) fn attention(
    cfg: &HybridConfig,
    w: &mut WeightSource,
    p: &str,
) -> Result<GatedAttention> {
    Ok(GatedAttention {
        q_and_gate: w.linear(&format!("{p}.attn_q"))?,
        k: w.linear(&format!("{p}.attn_k"))?,
        v: w.linear(&format!("{p}.attn_v"))?,
        o: w.linear(&format!("{p}.attn_output"))?,
        q_norm: norm(cfg, w, &format!("{p}.attn_q_norm"))?,
        k_norm: norm(cfg, w, &format!("{p}.attn_k_norm"))?,
        heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        rotary_dim: cfg.rotary_dim(),
    })
}

/// The MoE block or dense MLP of block `p` (`blk.3`).
pub(super) fn ffn(
    cfg: &HybridConfig,
    w: &mut WeightSource,
    p: &str,
    moe: bool,
) -> Result<FeedForward> {
    Ok(if moe {
        FeedForward::Moe(Box::new(self::moe(cfg, w, p)?))
    } else {
        FeedForward::Dense(GatedMlp::new(
            w.weight(&format!("{p}.ffn_gate.weight"))?,
            w.weight(&format!("{p}.ffn_up.weight"))?,
            w.linear(&format!("{p}.ffn_down"))?,
            Activation::Silu,
        )?)
    })
}

fn delta_net(cfg: &HybridConfig, w: &mut WeightSource, p: &str) -> Result<GatedDeltaNet> {
    let (in_b, in_a) = if w.contains(&format!("{p}.ssm_ba.weight")) {
        // Qwen3-Next: rows grouped per key head, [b (r rows), a (r rows)] each.
        let ba = w.dense(&format!("{p}.ssm_ba.weight"))?;
        let h = cfg.delta_net_shape().heads;
        let per_group = h.v_heads / h.k_heads;
        let rows = |offset: usize| -> Result<Tensor> {
            let ids: Vec<u32> = (0..h.k_heads)
                .flat_map(|g| (0..per_group).map(move |r| (g * 2 * per_group + offset + r) as u32))
                .collect();
            let n = ids.len();
            Ok(ba.index_select(&Tensor::from_vec(ids, n, &Device::Cpu)?, 0)?)
        };
        (Weight::Dense(rows(0)?), Weight::Dense(rows(per_group)?))
    } else {
        (w.weight(&format!("{p}.ssm_beta.weight"))?, w.weight(&format!("{p}.ssm_alpha.weight"))?)
    };
    let vector = |w: &mut WeightSource, name: &str| -> Result<Vec<f32>> {
        Ok(w.dense(&format!("{p}.{name}"))?.flatten_all()?.to_vec1()?)
    };
    GatedDeltaNet {
        shape: cfg.delta_net_shape(),
        in_proj: Projections::new(vec![
            w.weight(&format!("{p}.attn_qkv.weight"))?,
            w.weight(&format!("{p}.attn_gate.weight"))?,
            in_b,
            in_a,
        ])?,
        conv_weight: vector(w, "ssm_conv1d.weight")?,
        neg_decay_rate: vector(w, "ssm_a")?,
        dt_bias: vector(w, "ssm_dt.bias")?,
        norm_weight: vector(w, "ssm_norm.weight")?,
        out: w.linear(&format!("{p}.ssm_out"))?,
    }
    .checked()
}

/// Block `p`'s (`blk.3`) `count` routed experts, cut out of the file's stacked tensors in their
/// stored quantization (the GPU path loads the experts it leaves in host memory by this too).
pub fn gguf_experts(w: &mut WeightSource, p: &str, count: usize) -> Result<Vec<GatedMlp>> {
    let gate = w.weight(&format!("{p}.ffn_gate_exps.weight"))?;
    let up = w.weight(&format!("{p}.ffn_up_exps.weight"))?;
    let down = w.weight(&format!("{p}.ffn_down_exps.weight"))?;
    (0..count)
        .map(|e| {
            GatedMlp::new(
                gate.expert(e)?,
                up.expert(e)?,
                Linear::new(down.expert(e)?, None)?,
                Activation::Silu,
            )
        })
        .collect()
}

fn moe(cfg: &HybridConfig, w: &mut WeightSource, p: &str) -> Result<SparseMoe> {
    Ok(SparseMoe {
        router: w.linear(&format!("{p}.ffn_gate_inp"))?,
        experts: gguf_experts(w, p, cfg.num_experts)?,
        top_k: cfg.num_experts_per_tok,
        normalize_top_k: cfg.normalize_top_k(),
        shared: GatedMlp::new(
            w.weight(&format!("{p}.ffn_gate_shexp.weight"))?,
            w.weight(&format!("{p}.ffn_up_shexp.weight"))?,
            w.linear(&format!("{p}.ffn_down_shexp"))?,
            Activation::Silu,
        )?,
        shared_gate: w.linear(&format!("{p}.ffn_gate_inp_shexp"))?,
    })
}

/// The head as llama.cpp writes it: block `num_hidden_layers`, norms already `1 + w`.
fn mtp_head(cfg: &HybridConfig, w: &mut WeightSource) -> Result<Option<MtpHead>> {
    if cfg.mtp_num_hidden_layers.unwrap_or(0) == 0 {
        return Ok(None);
    }
    mtp::check_one_layer(cfg)?;
    let p = format!("blk.{}", cfg.num_hidden_layers);
    Ok(Some(MtpHead {
        embedding_norm: norm(cfg, w, &format!("{p}.nextn.enorm"))?,
        hidden_norm: norm(cfg, w, &format!("{p}.nextn.hnorm"))?,
        fc: w.linear(&format!("{p}.nextn.eh_proj"))?,
        input_norm: norm(cfg, w, &format!("{p}.attn_norm"))?,
        attention: attention(cfg, w, &p)?,
        post_attention_norm: norm(cfg, w, &format!("{p}.post_attention_norm"))?,
        ffn: ffn(cfg, w, &p, w.contains(&format!("{p}.ffn_gate_inp.weight")))?,
        norm: norm(cfg, w, &format!("{p}.nextn.shared_head_norm"))?,
    }))
}
