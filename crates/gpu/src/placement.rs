//! Where a hybrid model's routed experts live when the device cannot hold the whole model, as
//! llama.cpp users place them: `--cpu-moe` (every block's routed experts in system RAM),
//! `--n-cpu-moe N` (those of blocks `0..N`) and `--fit`: everything but the routed experts on
//! the device first (embeddings, head, attention and DeltaNet mixers, norms, routers, shared
//! experts), the KV pools and the DeltaNet states reserved, then the routed experts block by
//! block from the last while the budget holds; the blocks left over keep theirs in system RAM
//! and run them on the CPU's kernels. Whichever way, the blocks in system RAM are the first
//! ones, so every placement is some `--n-cpu-moe N`, and the startup line says which.
//! `--n-gpu-layers N` short of the block count runs the first blocks whole on the CPU (their
//! weights, keys, values and DeltaNet states in system RAM) and the last `N` on the device;
//! without it, `--fit` runs the fewest first blocks on the CPU that leave the device room for
//! everything but the routed experts (experts spill first: they are cheap to run on the CPU).
//!
//! The budget is `--gpu-memory-limit` where given; else, with `--fit`, what the device reports
//! free (`Gpu::memory`, which the caller asks and puts in the request, so planning stays a
//! function of numbers); with neither, nothing spills by size. Either way a sixteenth of it is
//! kept for a step's activations and the driver's own.

use std::fmt;

use candle_core::quantized::GgmlDType;
use spindle_models::{HybridConfig, Mixer, WeightSource};

use crate::DeviceMemory;

/// What the placement flags ask for, and what the device must hold besides the weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRequest {
    /// `--cpu-moe`: every block's routed experts in system RAM.
    pub cpu_moe: bool,
    /// `--n-cpu-moe N`: the routed experts of blocks `0..N` in system RAM.
    pub n_cpu_moe: usize,
    /// `--n-gpu-layers N`: the last `N` blocks on the device, the others whole on the CPU;
    /// `None`: all.
    pub n_gpu_layers: Option<usize>,
    /// `--fit`: routed experts that do not fit the budget go to system RAM.
    pub fit: bool,
    /// `--gpu-memory-limit`: device bytes the model may take, `None` where not given.
    pub memory_limit: Option<u64>,
    /// What the device reports free (`Gpu::memory`), `None` where it reports nothing; `--fit`'s
    /// budget when no limit is given.
    pub device_memory: Option<DeviceMemory>,
    /// Bytes of the device's KV pools (`--kv-cache-memory`).
    pub kv_bytes: u64,
    /// Sequences a step runs at most, each with its DeltaNet states on the device.
    pub sequences: usize,
    /// `--spec-mtp` above 0: the multi-token-prediction head, where the file has one, goes on
    /// the device with the dense weights.
    pub draft_head: bool,
}

impl Default for PlacementRequest {
    /// Everything on the device, fitted to a budget when one is given.
    fn default() -> Self {
        PlacementRequest {
            cpu_moe: false,
            n_cpu_moe: 0,
            n_gpu_layers: None,
            fit: true,
            memory_limit: None,
            device_memory: None,
            kv_bytes: 0,
            sequences: 1,
            draft_head: false,
        }
    }
}

impl PlacementRequest {
    /// What the device may take: `--gpu-memory-limit` where given, else with `--fit` what the
    /// device reports free; `None`: nothing spills by size.
    pub fn limit(&self) -> Option<MemoryLimit> {
        match (self.memory_limit, self.device_memory) {
            (Some(bytes), _) => Some(MemoryLimit::Given(bytes)),
            (None, Some(memory)) if self.fit => Some(MemoryLimit::Device(memory)),
            _ => None,
        }
    }
}

/// Where the device memory a placement is planned against came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryLimit {
    /// `--gpu-memory-limit`.
    Given(u64),
    /// What the device reported free when the placement was planned.
    Device(DeviceMemory),
}

impl MemoryLimit {
    pub fn bytes(&self) -> u64 {
        match self {
            MemoryLimit::Given(bytes) => *bytes,
            MemoryLimit::Device(memory) => memory.available,
        }
    }
}

impl fmt::Display for MemoryLimit {
    /// `--gpu-memory-limit 2048.0 MiB`, or the device's heap as `DeviceMemory` shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLimit::Given(bytes) => write!(f, "--gpu-memory-limit {}", mib(*bytes)),
            MemoryLimit::Device(memory) => write!(f, "{memory}"),
        }
    }
}

/// The device bytes of a model's parts, as its file's header gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelBytes {
    /// Everything the device holds but the routed experts.
    pub dense: u64,
    /// Per block, its routed experts (0 for a block with a dense MLP).
    pub experts: Vec<u64>,
    /// One sequence's DeltaNet states (convolution windows and matrices, every linear layer).
    pub states_per_sequence: u64,
    /// The multi-token-prediction head (block `num_hidden_layers`), 0 where the file has none.
    pub draft_head: u64,
    /// Per block, its weights but the routed experts (counted in `dense` too).
    pub block_weights: Vec<u64>,
    /// Per block, how it mixes tokens: attention keeps keys and values, DeltaNet states.
    pub block_mixers: Vec<Mixer>,
}

impl ModelBytes {
    /// The bytes `GpuHybrid` puts on the device for the model of `cfg` in `weights`: quantized
    /// matrices as stored, the rest as f32; the multi-token-prediction head (block
    /// `num_hidden_layers`) apart, as it goes there only when asked for.
    pub fn of_hybrid(cfg: &HybridConfig, weights: &WeightSource) -> Self {
        let blocks = cfg.num_hidden_layers;
        let mut bytes = ModelBytes {
            dense: 0,
            experts: vec![0; blocks],
            states_per_sequence: 0,
            draft_head: 0,
            block_weights: vec![0; blocks],
            block_mixers: cfg.layer_types(),
        };
        for (name, dtype, dims) in weights.stored_tensors() {
            let size = device_bytes(dtype, dims);
            match block_of(name) {
                Some(block) if block >= blocks => bytes.draft_head += size,
                Some(block) if is_expert_stack(name) => bytes.experts[block] += size,
                Some(block) => {
                    bytes.block_weights[block] += size;
                    bytes.dense += size;
                }
                None => bytes.dense += size,
            }
        }
        let shape = crate::linear_state::DeltaNetShape::of(cfg);
        let linear = cfg.layer_types().into_iter().filter(|&m| m == spindle_models::Mixer::Linear);
        let per_layer = shape.conv_state_len() + shape.recurrent_state_len();
        bytes.states_per_sequence = (linear.count() * per_layer * 4) as u64;
        bytes
    }
}

impl ModelBytes {
    /// Of `bytes_of_all` spread evenly over the blocks that mix tokens as `mixer` (a KV pool
    /// over the attention blocks, DeltaNet states over the others), the share of the blocks
    /// from `cpu_blocks` on: the device's.
    pub fn device_share(&self, bytes_of_all: u64, mixer: Mixer, cpu_blocks: usize) -> u64 {
        let of_kind = |blocks: &[Mixer]| blocks.iter().filter(|&&m| m == mixer).count() as u64;
        let (all, device) =
            (of_kind(&self.block_mixers), of_kind(&self.block_mixers[cpu_blocks..]));
        (bytes_of_all * device).checked_div(all).unwrap_or(0)
    }

    /// The weights of blocks `0..cpu_blocks`, routed experts aside.
    pub fn cpu_weights(&self, cpu_blocks: usize) -> u64 {
        self.block_weights[..cpu_blocks].iter().sum()
    }

    /// The bytes `GpuLlama` puts on the device for a dense model of `blocks` blocks in
    /// `weights` (quantized matrices as stored, the rest as f32); nothing for a checkpoint,
    /// whose header this does not read.
    pub fn of_dense(blocks: usize, weights: &WeightSource) -> Self {
        let mut bytes = ModelBytes {
            dense: 0,
            experts: vec![0; blocks],
            states_per_sequence: 0,
            draft_head: 0,
            block_weights: vec![0; blocks],
            block_mixers: vec![Mixer::Full; blocks],
        };
        for (name, dtype, dims) in weights.stored_tensors() {
            let size = device_bytes(dtype, dims);
            bytes.dense += size;
            if let Some(block) = block_of(name).filter(|&b| b < blocks) {
                bytes.block_weights[block] += size;
            }
        }
        bytes
    }
}

/// A tensor's bytes on the device: a quantized one as stored, a float one as f32.
fn device_bytes(dtype: GgmlDType, dims: &[usize]) -> u64 {
    let elements: usize = dims.iter().product();
    let bytes = match dtype {
        GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => elements * 4,
        quantized => elements / quantized.block_size() * quantized.type_size(),
    };
    bytes as u64
}

/// `3` of `blk.3.attn_norm.weight`.
fn block_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn is_expert_stack(name: &str) -> bool {
    ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
        .iter()
        .any(|stack| name.ends_with(&format!(".{stack}.weight")))
}

/// Which blocks run whole on the CPU, which keep their routed experts in system RAM, and the
/// device memory that leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The model's blocks.
    pub blocks: usize,
    /// Blocks `0..cpu_blocks` run whole on the CPU.
    pub cpu_blocks: usize,
    /// Blocks `0..host_blocks` keep their routed experts in system RAM (at least the CPU's).
    host_blocks: usize,
    /// Blocks whose routed experts are in system RAM (blocks with experts only).
    pub host_moe_blocks: usize,
    /// Blocks with routed experts.
    pub moe_blocks: usize,
    /// Weights on the device.
    pub device_weights: u64,
    /// Weights in system RAM: the CPU blocks' and the routed experts there.
    pub host_weights: u64,
    /// KV pools and DeltaNet states on the device.
    pub reserved: u64,
    /// The KV pools' share of `reserved`.
    pub kv_bytes: u64,
    /// What the weights and the reserve may take: the limit less a sixteenth for a step's
    /// activations and the driver's own; `None` without a limit.
    pub budget: Option<u64>,
    /// Where the budget came from.
    pub limit: Option<MemoryLimit>,
    /// Sequences whose DeltaNet states the reserve holds.
    pub state_slots: usize,
    /// Whether the multi-token-prediction head (where the file has one) is on the device.
    pub draft_head: bool,
}

/// A placement that cannot be honoured; the message names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlacementRefused(pub String);

impl Placement {
    /// Every routed expert on the device.
    pub fn on_device() -> Self {
        Placement {
            blocks: 0,
            cpu_blocks: 0,
            host_blocks: 0,
            host_moe_blocks: 0,
            moe_blocks: 0,
            device_weights: 0,
            host_weights: 0,
            reserved: 0,
            kv_bytes: 0,
            budget: None,
            limit: None,
            state_slots: 1,
            draft_head: true,
        }
    }

    /// The placement `request` asks for of a model of `bytes`.
    pub fn plan(bytes: &ModelBytes, request: &PlacementRequest) -> Result<Self, PlacementRefused> {
        let blocks = bytes.experts.len();
        let moe_blocks = bytes.experts.iter().filter(|&&b| b > 0).count();
        let asked = if request.cpu_moe { blocks } else { request.n_cpu_moe.min(blocks) };
        if asked > 0 && moe_blocks == 0 {
            let flag = if request.cpu_moe { "--cpu-moe" } else { "--n-cpu-moe" };
            return Err(PlacementRefused(format!("{flag}: this model has no routed experts")));
        }
        let limit = request.limit();
        let budget = limit.map(|limit| limit.bytes() - limit.bytes() / 16);
        let cpu_blocks = match (request.n_gpu_layers, budget) {
            (Some(n), _) => blocks.saturating_sub(n),
            // --fit without --n-gpu-layers: the fewest blocks on the CPU that leave the rest
            // room without any routed expert (none that does: refused below).
            (None, Some(budget)) if request.fit => (0..=blocks)
                .find(|&cpu| FixedPart::of(bytes, request, cpu).bytes <= budget)
                .unwrap_or(0),
            _ => 0,
        };
        // The CPU blocks' experts are in system RAM with the rest of those blocks.
        let asked = asked.max(cpu_blocks);
        let FixedPart { bytes: fixed, kv_bytes, reserved, cpu_weights } =
            FixedPart::of(bytes, request, cpu_blocks);
        let head = if request.draft_head { bytes.draft_head } else { 0 };
        let on_device =
            |host_blocks: usize| fixed + bytes.experts[host_blocks..].iter().sum::<u64>();
        let host_blocks = match limit.zip(budget) {
            None => asked,
            Some((limit, budget)) if fixed > budget => {
                let remedy = match limit {
                    MemoryLimit::Given(_) => "raise it",
                    MemoryLimit::Device(_) => "free device memory",
                };
                return Err(PlacementRefused(format!(
                    "{limit}: the device needs {} without any routed expert (weights {}, KV cache \
                     {}, DeltaNet states {}), more than that less a sixteenth kept for \
                     activations ({}); {remedy}, or lower --kv-cache-memory, --max-concurrent \
                     or --n-gpu-layers",
                    mib(fixed),
                    mib(fixed - reserved),
                    mib(kv_bytes),
                    mib(reserved - kv_bytes),
                    mib(budget)
                )));
            }
            Some((_, budget)) if request.fit => {
                (asked..=blocks).find(|&n| on_device(n) <= budget).unwrap_or(blocks)
            }
            Some((limit, budget)) if on_device(asked) > budget => {
                return Err(PlacementRefused(format!(
                    "{limit}: with --fit off the placement asked for needs {} on the device, more \
                     than the limit less a sixteenth ({}); turn --fit on, or raise --n-cpu-moe",
                    mib(on_device(asked)),
                    mib(budget)
                )))
            }
            Some(_) => asked,
        };
        let host_weights = bytes.experts[..host_blocks].iter().sum::<u64>() + cpu_weights;
        Ok(Placement {
            blocks,
            cpu_blocks,
            host_blocks,
            host_moe_blocks: bytes.experts[..host_blocks].iter().filter(|&&b| b > 0).count(),
            moe_blocks,
            device_weights: on_device(host_blocks) - reserved,
            host_weights,
            reserved,
            kv_bytes,
            budget,
            limit,
            state_slots: request.sequences.max(1),
            draft_head: head > 0,
        })
    }

    /// Whether block `block`'s routed experts (if it has any) run in system RAM.
    pub fn experts_on_host(&self, block: usize) -> bool {
        block < self.host_blocks
    }

    /// The `--n-cpu-moe` this placement is.
    pub fn host_blocks(&self) -> usize {
        self.host_blocks
    }
}

/// What the device holds of a model whose first blocks run on the CPU, routed experts aside.
struct FixedPart {
    /// The device's weights but routed experts, with the reserve.
    bytes: u64,
    /// The device's share of the KV pools.
    kv_bytes: u64,
    /// The KV pools' and the DeltaNet states' share on the device.
    reserved: u64,
    /// The weights of the blocks on the CPU.
    cpu_weights: u64,
}

impl FixedPart {
    fn of(bytes: &ModelBytes, request: &PlacementRequest, cpu_blocks: usize) -> Self {
        let kv_bytes = bytes.device_share(request.kv_bytes, Mixer::Full, cpu_blocks);
        let states = bytes.device_share(bytes.states_per_sequence, Mixer::Linear, cpu_blocks);
        let reserved = kv_bytes + request.sequences as u64 * states;
        let head = if request.draft_head { bytes.draft_head } else { 0 };
        let cpu_weights = bytes.cpu_weights(cpu_blocks);
        let bytes = bytes.dense - cpu_weights + head + reserved;
        FixedPart { bytes, kv_bytes, reserved, cpu_weights }
    }
}

/// Bytes as MiB, for the refusals.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 blocks of 100 expert bytes and 200 other bytes each (three DeltaNet blocks, then one
    /// attention block), 1000 dense bytes in all, 10 state bytes a sequence.
    fn four_blocks() -> ModelBytes {
        ModelBytes {
            dense: 1000,
            experts: vec![100; 4],
            states_per_sequence: 10,
            draft_head: 0,
            block_weights: vec![200; 4],
            block_mixers: [[Mixer::Linear; 3].as_slice(), &[Mixer::Full]].concat(),
        }
    }

    fn limit(budget: u64) -> Option<u64> {
        // The limit whose budget (less a sixteenth) is `budget`, to the byte.
        (budget * 16 / 15..).find(|l| l - l / 16 >= budget)
    }

    #[test]
    fn without_a_limit_the_flags_alone_place_the_experts() {
        let bytes = four_blocks();
        let all = Placement::plan(&bytes, &PlacementRequest::default()).unwrap();
        assert_eq!((all.host_blocks(), all.device_weights, all.host_weights), (0, 1400, 0));
        let request = PlacementRequest { n_cpu_moe: 3, ..PlacementRequest::default() };
        let three = Placement::plan(&bytes, &request).unwrap();
        assert_eq!((three.host_blocks(), three.device_weights, three.host_weights), (3, 1100, 300));
        assert!(three.experts_on_host(2) && !three.experts_on_host(3));
        let request = PlacementRequest { cpu_moe: true, ..PlacementRequest::default() };
        let cpu = Placement::plan(&bytes, &request).unwrap();
        assert_eq!((cpu.host_blocks(), cpu.host_moe_blocks, cpu.moe_blocks), (4, 4, 4));
        // More blocks than the model has: all of them.
        let request = PlacementRequest { n_cpu_moe: 9, ..PlacementRequest::default() };
        assert_eq!(Placement::plan(&bytes, &request).unwrap().host_blocks(), 4);
    }

    #[test]
    fn fit_reserves_the_kv_and_states_then_keeps_the_last_blocks_experts_that_fit() {
        let bytes = four_blocks();
        // Dense 1000 + KV 50 + 2 sequences' states 20: 1070 fixed; room for two blocks' experts.
        let base = PlacementRequest { kv_bytes: 50, sequences: 2, ..PlacementRequest::default() };
        let request = PlacementRequest { memory_limit: limit(1270 + 99), ..base.clone() };
        let fitted = Placement::plan(&bytes, &request).unwrap();
        assert_eq!((fitted.host_blocks(), fitted.reserved, fitted.device_weights), (2, 70, 1200));
        assert!(fitted.budget.unwrap() < 1370);
        // Exactly enough for all: nothing spills.
        let request = PlacementRequest { memory_limit: limit(1470), ..base.clone() };
        assert_eq!(Placement::plan(&bytes, &request).unwrap().host_blocks(), 0);
        // --n-cpu-moe is the least that goes: fit never brings those blocks back.
        let request = PlacementRequest { n_cpu_moe: 3, memory_limit: limit(1470), ..base.clone() };
        assert_eq!(Placement::plan(&bytes, &request).unwrap().host_blocks(), 3);
        // Room for the fixed part only: every block's experts in system RAM.
        let request = PlacementRequest { memory_limit: limit(1070), ..base.clone() };
        assert_eq!(Placement::plan(&bytes, &request).unwrap().host_blocks(), 4);
    }

    #[test]
    fn the_budget_is_the_limit_given_else_what_the_device_has_free_with_fit() {
        let bytes = four_blocks();
        let device = |available: Option<u64>| DeviceMemory {
            total: 1 << 30,
            available: available.unwrap(),
            source: crate::MemorySource::VulkanHeap(0),
            measured: true,
            system_ram: false,
        };
        // Free device memory for the fixed 1010 and two blocks' experts: two blocks spill.
        let free = device(limit(1210));
        let request = PlacementRequest { device_memory: Some(free), ..PlacementRequest::default() };
        let fitted = Placement::plan(&bytes, &request).unwrap();
        assert_eq!((fitted.host_blocks(), fitted.limit), (2, Some(MemoryLimit::Device(free))));
        // A limit given wins over the device's, larger or smaller.
        let given = PlacementRequest { memory_limit: limit(1410), ..request.clone() };
        let placed = Placement::plan(&bytes, &given).unwrap();
        assert_eq!((placed.host_blocks(), placed.limit), (0, limit(1410).map(MemoryLimit::Given)));
        let given = PlacementRequest { memory_limit: limit(1110), ..request.clone() };
        assert_eq!(Placement::plan(&bytes, &given).unwrap().host_blocks(), 3);
        // With --fit off the device's memory is no budget; without it, none either: everything
        // on the device, as before.
        for unbudgeted in [
            PlacementRequest { fit: false, ..request.clone() },
            PlacementRequest { device_memory: None, ..request.clone() },
        ] {
            let placed = Placement::plan(&bytes, &unbudgeted).unwrap();
            assert_eq!((placed.host_blocks(), placed.budget, placed.limit), (0, None, None));
        }
        // A device without room for the fixed part refuses, naming its heap.
        let small = PlacementRequest { device_memory: Some(device(limit(199))), ..request };
        let refusal = Placement::plan(&bytes, &small).unwrap_err().0;
        assert!(refusal.starts_with("Vulkan heap 0: ") && refusal.contains("free device memory"));
    }

    #[test]
    fn placements_that_cannot_be_honoured_are_refused_naming_the_flag() {
        let bytes = four_blocks();
        let refused = |request: PlacementRequest| Placement::plan(&bytes, &request).unwrap_err().0;
        // 200 bytes outside the blocks: no room even with every block on the CPU.
        let no_room = PlacementRequest { memory_limit: limit(199), ..PlacementRequest::default() };
        assert!(refused(no_room).starts_with("--gpu-memory-limit"));
        let fit_off = PlacementRequest {
            fit: false,
            memory_limit: limit(1200),
            ..PlacementRequest::default()
        };
        assert!(refused(fit_off.clone()).contains("--fit off"));
        // 1010 fixed (one sequence's states) and one block's experts.
        let enough = PlacementRequest { n_cpu_moe: 3, ..fit_off };
        assert_eq!(Placement::plan(&bytes, &enough).unwrap().host_blocks(), 3);
        let all_layers = PlacementRequest { n_gpu_layers: Some(99), ..PlacementRequest::default() };
        assert!(Placement::plan(&bytes, &all_layers).is_ok());
        let dense = ModelBytes { experts: vec![0; 4], ..four_blocks() };
        let cpu_moe = PlacementRequest { cpu_moe: true, ..PlacementRequest::default() };
        let refusal = Placement::plan(&dense, &cpu_moe).unwrap_err().0;
        assert_eq!(refusal, "--cpu-moe: this model has no routed experts");
    }

    /// `--n-gpu-layers 2` of 4 blocks: blocks 0 and 1 whole on the CPU (their weights and
    /// experts in system RAM, their DeltaNet states and no keys there); the device reserves
    /// the states of its one DeltaNet block and the keys of the attention block.
    #[test]
    fn the_first_blocks_run_on_the_cpu_short_of_n_gpu_layers() {
        let bytes = four_blocks();
        let base = PlacementRequest { kv_bytes: 60, sequences: 3, ..PlacementRequest::default() };
        let two = PlacementRequest { n_gpu_layers: Some(2), ..base.clone() };
        let placed = Placement::plan(&bytes, &two).unwrap();
        assert_eq!((placed.cpu_blocks, placed.host_blocks(), placed.host_moe_blocks), (2, 2, 2));
        assert!(placed.experts_on_host(1) && !placed.experts_on_host(2));
        // 1000 - 2 × 200 dense, 2 × 100 experts on the device; 2 × 300 in system RAM.
        assert_eq!((placed.device_weights, placed.host_weights), (800, 600));
        // The KV pool's one layer is on the device; one of three DeltaNet layers' states.
        let all = Placement::plan(&bytes, &base).unwrap();
        assert_eq!((all.reserved, placed.reserved), (60 + 3 * 10, 60 + 3 * 3));
        // --n-cpu-moe past the CPU blocks moves more experts; --fit fits the rest.
        let three = PlacementRequest { n_cpu_moe: 3, ..two.clone() };
        assert_eq!(Placement::plan(&bytes, &three).unwrap().host_blocks(), 3);
        let fitted = PlacementRequest { memory_limit: limit(600 + 69 + 100), ..two.clone() };
        let fitted = Placement::plan(&bytes, &fitted).unwrap();
        assert_eq!((fitted.cpu_blocks, fitted.host_blocks()), (2, 3));
        // One block on the device: it holds no DeltaNet state but the pool's keys.
        let one = PlacementRequest { n_gpu_layers: Some(1), ..base.clone() };
        assert_eq!(Placement::plan(&bytes, &one).unwrap().reserved, 60);
        // None: the KV pool and every state stay in system RAM.
        let none = PlacementRequest { n_gpu_layers: Some(0), ..base };
        let placed = Placement::plan(&bytes, &none).unwrap();
        assert_eq!((placed.cpu_blocks, placed.reserved, placed.device_weights), (4, 0, 200));
    }

    /// With --fit and no --n-gpu-layers, the first blocks go to the CPU only when the rest
    /// cannot hold everything but the routed experts: experts spill first.
    #[test]
    fn fit_runs_the_first_blocks_on_the_cpu_when_the_rest_does_not_fit_without_experts() {
        let bytes = four_blocks();
        let base = PlacementRequest { kv_bytes: 60, sequences: 3, ..PlacementRequest::default() };
        // 1000 + 60 + 30 fixed: fits with two blocks' experts spilled, no block on the CPU.
        let roomy = PlacementRequest { memory_limit: limit(1090 + 200), ..base.clone() };
        let placed = Placement::plan(&bytes, &roomy).unwrap();
        assert_eq!((placed.cpu_blocks, placed.host_blocks()), (0, 2));
        // 1089: not even the fixed part; block 0 on the CPU leaves 800 + 60 + 3 × 6 = 878, and
        // blocks 2 and 3's experts (200) fit beside it.
        let tight = PlacementRequest { memory_limit: limit(1089), ..base.clone() };
        let placed = Placement::plan(&bytes, &tight).unwrap();
        assert_eq!((placed.cpu_blocks, placed.host_blocks()), (1, 2));
        assert_eq!(placed.device_weights + placed.reserved, 1078);
        // 470: three blocks on the CPU (400 + 60, the attention block's states none; two
        // would take 600 + 60 + 3 × 3).
        let small = PlacementRequest { memory_limit: limit(470), ..base.clone() };
        assert_eq!(Placement::plan(&bytes, &small).unwrap().cpu_blocks, 3);
        // --n-gpu-layers given: that many, or refused; --fit off: refused.
        let given = PlacementRequest { n_gpu_layers: Some(4), ..tight.clone() };
        assert!(Placement::plan(&bytes, &given).unwrap_err().0.contains("--n-gpu-layers"));
        let off = PlacementRequest { fit: false, ..tight };
        assert!(Placement::plan(&bytes, &off).is_err());
    }

    #[test]
    fn expert_stacks_and_blocks_are_told_apart_by_name() {
        assert_eq!(block_of("blk.12.ffn_up_exps.weight"), Some(12));
        assert_eq!(block_of("token_embd.weight"), None);
        assert!(is_expert_stack("blk.0.ffn_down_exps.weight"));
        assert!(!is_expert_stack("blk.0.ffn_down_shexp.weight"));
        assert_eq!(device_bytes(GgmlDType::F16, &[3, 4]), 48);
        assert_eq!(device_bytes(GgmlDType::Q8_0, &[2, 64]), 2 * 2 * 34);
    }
}
