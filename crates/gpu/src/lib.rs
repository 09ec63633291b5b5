//! Compute kernels for Spindle's model steps on a GPU, written once in WGSL and run by wgpu on
//! Vulkan (NVIDIA, AMD, Intel, and Mesa's lavapipe on any CPU, which is how CI runs them),
//! Metal (Apple Silicon) and DX12.
//!
//! Every kernel reduces each output in a fixed order that does not depend on how many rows a
//! step holds, so a sequence's results are bitwise the same alone or batched (on one device).
//! Against the CPU kernels of `spindle-models` they agree closely, not bitwise: the tests
//! record the tolerances.
//!
//! ```no_run
//! # fn main() -> spindle_gpu::Result<()> {
//! use spindle_gpu::{Gpu, GpuMatrix, Matmul, WeightFormat};
//! let gpu = Gpu::open(None)?;
//! println!("{}", gpu.info().name);
//! let bytes = vec![0u8; 2 * 34]; // two Q8_0 rows of 32 values
//! let w = GpuMatrix::upload(&gpu, WeightFormat::Q8_0, 2, 32, &bytes)?;
//! let x = gpu.upload(&[1.0; 32])?;
//! let product = Matmul::new(&gpu, WeightFormat::Q8_0)?;
//! // Kernels are recorded into a step, submitted once.
//! let y = gpu.run(|step| {
//!     let y = product.forward(step, &w, &x)?;
//!     Ok(step.read(&y))
//! })?;
//! assert_eq!(y.values()?.len(), 2);
//! # Ok(()) }
//! ```

mod attention;
mod bind_groups;
mod buffer;
mod buffer_pool;
mod causal_conv;
mod delta_net_layer;
mod delta_rule;
mod device;
mod device_memory;
mod elementwise;
mod error;
mod gated_attention;
mod host_experts;
mod hybrid;
mod kernel;
mod kv_pools;
mod linear_attention;
mod linear_state;
mod llama;
mod loading;
mod matmul;
mod moe;
mod norm;
mod placement;
mod resident_states;
mod rope;
mod step;

pub use attention::{
    Attention, AttentionShape, KvCache, KvFormat, KvPool, PagedRows, QueryPlace, MAX_HEAD_DIM,
};
pub use bind_groups::BindGroupCount;
pub use buffer::GpuTensor;
pub use causal_conv::{CausalConv, ConvOutputs};
pub use delta_rule::{DeltaRule, DeltaRuleInputs};
pub use device::{AdapterSummary, Gpu};
pub use device_memory::{DeviceMemory, MemorySource};
pub use elementwise::{AddRows, Elementwise};
pub use error::{GpuError, Result};
pub use hybrid::GpuHybrid;
pub use linear_attention::{
    LinearAttention, LinearAttentionHostWeights, LinearAttentionWeights, Projected,
};
pub use linear_state::{DeltaNetShape, LinearRun, LinearRuns, LinearStates, MAX_K_DIM};
pub use llama::GpuLlama;
pub use matmul::{Embed, GatheredMatmul, GpuMatrix, Matmul, WeightFormat};
pub use moe::{MoeRoute, MAX_TOP_K};
pub use norm::{GatedRmsNorm, L2Norm, RmsNorm};
pub use placement::{MemoryLimit, ModelBytes, Placement, PlacementRefused, PlacementRequest};
pub use resident_states::StateTraffic;
pub use rope::{Rope, RopePairs, RopeShape, RopeTable};
pub use step::{Readback, Step};
