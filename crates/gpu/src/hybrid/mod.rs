//! The hybrid Qwen3.5 / Qwen3-Next family on the GPU: the same model as `spindle_models`' CPU
//! `Qwen3Next`, from a llama.cpp GGUF, on the kernels of this crate. Per layer `x +=
//! mixer(norm(x))` (Gated DeltaNet or gated full attention), then `x += ffn(norm(x))` (the
//! sparse MoE with its shared expert, or a dense MLP); the file's norms already hold the
//! zero-centred `1 + w`. Keys and values sit in device pools that mirror the callers' `PagedKv`;
//! the DeltaNet states stay on the device between steps, each cache holding its slot
//! (`resident_states`); a pass that verifies drafts keeps each position's states there too, so
//! rejected drafts are forgotten on the device. One step of [`CausalLm::forward_batch`] is one submission, plus two for
//! each block whose routed experts a [`Placement`] left in system RAM: the step stops before
//! them, the block's shared expert is submitted to run while they run on the CPU, and the next
//! submission goes on from their sum. Where the placement runs the first blocks whole on the
//! CPU (`--n-gpu-layers` short of the block count), a step runs them there first, with
//! `spindle_models`' kernels, their keys and values in the host pool and their DeltaNet states
//! in the caches, and the device goes on from the residual stream they hand over.

mod mtp;
mod parts;

use std::sync::Arc;

use spindle_models::{
    BatchEntry, CausalLm, DraftHead, FirstBlocks, HybridConfig, HybridFirstBlocks, KvShape, Mixer,
    ModelError, RecurrentState, RopeStyle, Rotary, TransformerConfig, WeightSource,
};

use crate::buffer::GpuTensor;
use crate::delta_net_layer::DeltaNetLayer;
use crate::device::Gpu;
use crate::elementwise::Elementwise;
use crate::gated_attention::{AttentionKernels, GatedAttention, GatedAttentionShape};
use crate::host_experts::HostExperts;
use crate::kv_pools::KvPools;
use crate::linear_attention::LinearAttention;
use crate::linear_state::DeltaNetShape;
use crate::loading::{model_error, upload_head, upload_matrix, upload_vector, Products};
use crate::matmul::{Embed, GpuMatrix};
use crate::moe::{FeedForwardKernels, GatedMlp, RoutedExperts, SparseMoe};
use crate::norm::RmsNorm;
use crate::placement::Placement;
use crate::resident_states::{ResidentStates, StateTraffic};
use crate::rope::RopeAngles;
use crate::step::rows_per_range;
use mtp::MtpHead;
use parts::StepInputs;

enum TokenMixer {
    Linear(DeltaNetLayer),
    Full(GatedAttention),
}

enum FeedForward {
    Moe(Box<SparseMoe>),
    Dense(GatedMlp),
}

struct Layer {
    input_norm: GpuTensor,
    mixer: TokenMixer,
    post_attention_norm: GpuTensor,
    ffn: FeedForward,
}

/// The kernels a step uses, compiled once.
struct Kernels {
    products: Products,
    embed: Embed,
    norm: RmsNorm,
    add: Elementwise,
    attention: AttentionKernels,
    linear: LinearAttention,
    ffn: FeedForwardKernels,
}

pub struct GpuHybrid {
    cfg: HybridConfig,
    /// The dense-model view of the sizes, for [`CausalLm::config`].
    summary: TransformerConfig,
    gpu: Arc<Gpu>,
    kernels: Kernels,
    embed: GpuMatrix,
    /// `None`: tied to the embedding table.
    head: Option<GpuMatrix>,
    /// The blocks the placement runs on the CPU, before those on the device.
    first_blocks: Option<HybridFirstBlocks>,
    /// The blocks on the device, after the CPU's.
    layers: Vec<Layer>,
    norm: GpuTensor,
    rotary: Rotary,
    pools: KvPools,
    states: ResidentStates,
    /// The multi-token-prediction head, where the file has one and the placement asks for it.
    mtp: Option<MtpHead>,
}

impl GpuHybrid {
    /// Loads the model of `cfg` from a llama.cpp file's `weights` (see
    /// `spindle_models::open_hybrid`) onto `gpu`, every routed expert there; what this path does
    /// not run (checkpoints, weight formats without a kernel) is refused here.
    pub fn load(
        gpu: Arc<Gpu>,
        cfg: HybridConfig,
        weights: &mut WeightSource,
    ) -> spindle_models::Result<Self> {
        Self::load_placed(gpu, cfg, weights, &Placement::on_device())
    }

    /// As [`GpuHybrid::load`], with the routed experts of the blocks `placement` says in system
    /// RAM (see [`crate::ModelBytes`] and [`Placement::plan`]).
    pub fn load_placed(
        gpu: Arc<Gpu>,
        cfg: HybridConfig,
        weights: &mut WeightSource,
        placement: &Placement,
    ) -> spindle_models::Result<Self> {
        if !matches!(weights, WeightSource::Gguf(_)) {
            // Checkpoints store the norms as `w` and fuse the in-projections differently.
            return Err(ModelError::BadConfig(
                "on the GPU: hybrid models load from llama.cpp GGUF files".into(),
            ));
        }
        let linear_shape = DeltaNetShape::of(&cfg);
        let norm_eps = cfg.delta_net_shape().norm_eps as f32;
        let attention_shape = GatedAttentionShape {
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            rotary_dim: cfg.rotary_dim(),
            norm_eps: cfg.rms_norm_eps as f32,
        };
        let embed = upload_matrix(&gpu, weights.weight("token_embd.weight")?)?;
        let head = upload_head(&gpu, weights)?;
        let cpu_blocks = placement.cpu_blocks;
        let first_blocks = match cpu_blocks {
            0 => None,
            blocks => Some(HybridFirstBlocks::load_gguf(&cfg, weights, blocks)?),
        };
        let mut layers = Vec::new();
        for (i, kind) in cfg.layer_types().into_iter().enumerate().skip(cpu_blocks) {
            let p = format!("blk.{i}");
            let mixer = match kind {
                Mixer::Linear => TokenMixer::Linear(DeltaNetLayer::load(
                    &gpu,
                    weights,
                    &p,
                    linear_shape,
                    norm_eps,
                )?),
                Mixer::Full => {
                    TokenMixer::Full(GatedAttention::load(&gpu, weights, &p, attention_shape)?)
                }
            };
            layers.push(Layer {
                input_norm: upload_vector(&gpu, weights, &format!("{p}.attn_norm.weight"), 0.0)?,
                mixer,
                post_attention_norm: upload_vector(
                    &gpu,
                    weights,
                    &format!("{p}.post_attention_norm.weight"),
                    0.0,
                )?,
                ffn: feed_forward(&gpu, &cfg, weights, &p, (cfg.is_moe_layer(i), placement))?,
            });
        }
        let norm = upload_vector(&gpu, weights, "output_norm.weight", 0.0)?;
        let mtp = if placement.draft_head {
            MtpHead::load(&gpu, &cfg, weights, attention_shape)?
        } else {
            None
        };
        let matrices = layers
            .iter()
            .flat_map(|l| {
                let mixer: Vec<&GpuMatrix> = match &l.mixer {
                    TokenMixer::Linear(net) => net.matrices().into(),
                    TokenMixer::Full(attn) => attn.matrices().into(),
                };
                let ffn: Vec<&GpuMatrix> = match &l.ffn {
                    FeedForward::Moe(moe) => moe.matrices().collect(),
                    FeedForward::Dense(mlp) => mlp.matrices().into(),
                };
                mixer.into_iter().chain(ffn)
            })
            .chain(head.iter())
            .chain([&embed])
            .chain(mtp.iter().flat_map(MtpHead::matrices));
        let stacks = layers
            .iter()
            .flat_map(|l| match &l.ffn {
                FeedForward::Moe(moe) => moe.stacks(),
                FeedForward::Dense(_) => Vec::new(),
            })
            .chain(mtp.iter().flat_map(MtpHead::stacks));
        let linear_layers =
            cfg.layer_types().iter().skip(cpu_blocks).filter(|&&m| m == Mixer::Linear).count();
        let states = ResidentStates::new(
            gpu.clone(),
            linear_shape,
            (cpu_blocks, linear_layers),
            placement.state_slots,
        );
        let kernels = (|| {
            Ok(Kernels {
                products: Products::new(&gpu, matrices)?,
                embed: Embed::new(&gpu, embed.format())?,
                norm: RmsNorm::new(&gpu)?,
                add: Elementwise::add(&gpu)?,
                attention: AttentionKernels::new(&gpu)?,
                linear: LinearAttention::new(&gpu)?,
                ffn: FeedForwardKernels::new(&gpu, stacks)?,
            })
        })()
        .map_err(model_error)?;
        Ok(GpuHybrid {
            rotary: Rotary::new(
                cfg.rotary_dim(),
                cfg.rope_theta(),
                &cfg.rope_scaling,
                RopeStyle::Halves,
            ),
            summary: cfg.summary(),
            cfg,
            gpu,
            kernels,
            embed,
            head,
            first_blocks,
            layers,
            norm,
            pools: KvPools::from_layer(cpu_blocks),
            states,
            mtp,
        })
    }

    /// The DeltaNet states moved between the caches and the device so far: uploaded when a
    /// sequence comes with a state the device does not hold, read back when a cache asks.
    pub fn state_traffic(&self) -> StateTraffic {
        self.states.traffic()
    }
}

impl Drop for GpuHybrid {
    /// The device's kept bind groups hold this model's weights: they go with it.
    fn drop(&mut self) {
        self.gpu.forget_bind_groups();
    }
}

impl CausalLm for GpuHybrid {
    fn config(&self) -> &TransformerConfig {
        &self.summary
    }

    fn kv_shapes(&self) -> Vec<Option<KvShape>> {
        let shape = KvShape {
            kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
            window: None,
        };
        let kinds = self.cfg.layer_types().into_iter();
        kinds.map(|kind| (kind == Mixer::Full).then_some(shape)).collect()
    }

    fn initial_recurrent_state(&self) -> RecurrentState {
        self.cfg.initial_recurrent_state()
    }

    fn draft_head(&self) -> Option<&dyn DraftHead> {
        self.mtp.as_ref().map(|_| self as &dyn DraftHead)
    }

    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> spindle_models::Result<Vec<Vec<f32>>> {
        // Every entry is checked before any work, so a refusal changes no cache.
        let (rows, ids) = spindle_models::batch_rows(batch)?;
        let wanted = spindle_models::logit_rows(batch, &rows);
        let angles = RopeAngles::of_batch(&self.rotary, batch);
        let states = self.states.claim(batch, &rows).map_err(model_error)?;
        let groups = self.pools.groups(&self.gpu, &self.kv_shapes(), batch).map_err(model_error)?;
        let keep_hidden = batch.iter().any(|e| e.cache.wants_hidden_states());
        let on_cpu =
            self.first_blocks.as_ref().map(|b| b.forward(batch, &rows, &ids)).transpose()?;
        let (logits, hidden) = (|| {
            let rope = angles.upload(&self.gpu)?;
            let inputs = StepInputs {
                ids: &ids,
                from_cpu: on_cpu.as_deref(),
                groups: &groups,
                rope: &rope,
                states: &states,
                wanted: &wanted,
                keep_hidden,
            };
            let (logits, hidden) = self.run_step(&inputs)?;
            Ok((logits.values()?, hidden.map(|h| h.values()).transpose()?))
        })()
        .map_err(model_error)?;
        states.hand_over(batch);
        let width = self.cfg.hidden_size;
        for (entry, &(first, len)) in batch.iter_mut().zip(&rows) {
            if entry.verifies() {
                entry.cache.advance_verified(len);
            } else {
                entry.cache.advance(len);
            }
            if let Some(hidden) = hidden.as_ref().filter(|_| entry.cache.wants_hidden_states()) {
                entry.cache.set_hidden_states(hidden[first * width..][..len * width].to_vec(), len);
            }
        }
        Ok(rows_per_range(&logits, self.cfg.vocab_size, &wanted))
    }
}

/// Block `p`'s (`blk.3`) feed-forward: the sparse MoE with its shared expert (experts stacked
/// in one tensor per matrix, as llama.cpp writes them, on the device or in system RAM as
/// `placement` says), or a dense MLP.
fn feed_forward(
    gpu: &Gpu,
    cfg: &HybridConfig,
    w: &mut WeightSource,
    p: &str,
    (moe, placement): (bool, &Placement),
) -> spindle_models::Result<FeedForward> {
    let mlp = |w: &mut WeightSource, suffix: &str| -> spindle_models::Result<GatedMlp> {
        let mut matrix =
            |name: &str| upload_matrix(gpu, w.weight(&format!("{p}.{name}{suffix}.weight"))?);
        Ok(GatedMlp { gate: matrix("ffn_gate")?, up: matrix("ffn_up")?, down: matrix("ffn_down")? })
    };
    if !moe {
        return Ok(FeedForward::Dense(mlp(w, "")?));
    }
    let block = p.strip_prefix("blk.").and_then(|b| b.parse().ok());
    let experts = if block.is_some_and(|b| placement.experts_on_host(b)) {
        RoutedExperts::Host(HostExperts::load(w, p, cfg.num_experts)?)
    } else {
        let mut stack = |name: &str| -> spindle_models::Result<GpuMatrix> {
            let stack = upload_matrix(gpu, w.weight(&format!("{p}.{name}.weight"))?)?;
            if cfg.num_experts == 0 || !stack.rows().is_multiple_of(cfg.num_experts) {
                return Err(ModelError::BadConfig(format!(
                    "{p}.{name} has {} rows: no whole number of rows for each of {} experts",
                    stack.rows(),
                    cfg.num_experts
                )));
            }
            Ok(stack)
        };
        RoutedExperts::Device(GatedMlp {
            gate: stack("ffn_gate_exps")?,
            up: stack("ffn_up_exps")?,
            down: stack("ffn_down_exps")?,
        })
    };
    Ok(FeedForward::Moe(Box::new(SparseMoe {
        router: upload_matrix(gpu, w.weight(&format!("{p}.ffn_gate_inp.weight"))?)?,
        experts,
        expert_count: cfg.num_experts,
        top_k: cfg.num_experts_per_tok,
        normalize_top_k: cfg.normalize_top_k(),
        shared: mlp(w, "_shexp")?,
        shared_gate: upload_matrix(gpu, w.weight(&format!("{p}.ffn_gate_inp_shexp.weight"))?)?,
    })))
}
