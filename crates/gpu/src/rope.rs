//! Rotary position embedding on the device, turning q or k in place by a host-made table.

use spindle_models::{BatchEntry, Rotary};

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::Step;

/// How rotary embedding pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// `(i, i + rotary_dim/2)`: HF's `rotate_half`, llama.cpp's NEOX mode.
    Halves,
    /// `(2i, 2i + 1)`: llama.cpp's normal mode.
    Interleaved,
}

/// The layout of the tensor a [`Rope`] turns: `(tokens, heads, head_dim)`, of which the first
/// `rotary_dim` values of each head turn (all of them but in partial-rotary models).
#[derive(Clone, Copy, Debug)]
pub struct RopeShape {
    pub heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub pairs: RopePairs,
}

/// Per token, the cosines and sines of its `rotary_dim / 2` angles (attention scaling already
/// folded in), token after token.
pub struct RopeTable {
    pub cos: GpuTensor,
    pub sin: GpuTensor,
}

/// A [`RopeTable`]'s values on the host: those of every token of a step's entries, in order.
pub(crate) struct RopeAngles {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    /// `rotary`'s angles at each entry's new positions (after what its cache holds).
    pub(crate) fn of_batch(rotary: &Rotary, batch: &[BatchEntry<'_>]) -> Self {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for entry in batch {
            let (c, s) = rotary.cos_sin(entry.cache.len(), entry.tokens.len());
            cos.extend(c);
            sin.extend(s);
        }
        RopeAngles { cos, sin }
    }

    pub(crate) fn upload(&self, gpu: &Gpu) -> Result<RopeTable> {
        Ok(RopeTable { cos: gpu.upload_for_step(&self.cos)?, sin: gpu.upload_for_step(&self.sin)? })
    }
}

pub struct Rope {
    kernel: Kernel,
}

impl Rope {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Rope { kernel: Kernel::new(gpu, "rope", include_str!("shaders/rope.wgsl"))? })
    }

    /// Turns `x` (tokens, heads, head_dim) in place.
    pub fn apply(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        shape: RopeShape,
        table: &RopeTable,
    ) -> Result<()> {
        let RopeShape { heads, head_dim, rotary_dim, pairs } = shape;
        let half = rotary_dim / 2;
        if half == 0 || rotary_dim % 2 == 1 || rotary_dim > head_dim || heads == 0 {
            return Err(GpuError::BadInput(format!(
                "rotary width {rotary_dim} over heads of {head_dim} ({heads} heads)"
            )));
        }
        let tokens = x.len() / (heads * head_dim);
        if x.len() != tokens * heads * head_dim
            || table.cos.len() != tokens * half
            || table.sin.len() != tokens * half
        {
            return Err(GpuError::BadInput(format!(
                "{} values of {heads} heads of {head_dim}, with tables of {} and {} for {half} angles a token",
                x.len(),
                table.cos.len(),
                table.sin.len()
            )));
        }
        let params = [
            count(tokens, "tokens")?,
            count(heads, "heads")?,
            count(head_dim, "head width")?,
            count(rotary_dim, "rotary width")?,
            u32::from(pairs == RopePairs::Interleaved),
        ];
        let groups = count((tokens * heads * half).div_ceil(64), "rope groups")?;
        self.kernel.record(
            step,
            &[&x.buffer, &table.cos.buffer, &table.sin.buffer],
            &params,
            (groups, 1),
        );
        Ok(())
    }
}
