//! f32 tensors and raw weight bytes in device memory, and copies to and from the host. What a
//! step makes or uploads for itself (outputs, indices, tables) comes from the device's
//! [`BufferPool`] and goes back there when dropped; weights and states are buffers of their own.

use std::sync::Arc;

use wgpu::util::DeviceExt;
use wgpu::BufferUsages;

use crate::buffer_pool::{BufferKind, BufferPool};
use crate::device::Gpu;
use crate::error::{GpuError, Result};

/// A row-major block of f32 values on the device.
pub struct GpuTensor {
    pub(crate) buffer: wgpu::Buffer,
    len: usize,
    /// Held for its drop.
    _pooled: Option<Pooled>,
}

/// A pooled buffer's way back: dropped with its tensor, it gives the buffer to its pool.
struct Pooled {
    pool: Arc<BufferPool>,
    buffer: wgpu::Buffer,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(BufferKind::Storage, self.buffer.clone());
    }
}

impl GpuTensor {
    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Bytes as the device stores them for one binding (weights in their file layout; a step's
/// indices, pooled).
pub(crate) struct GpuBytes {
    pub(crate) buffer: wgpu::Buffer,
    /// Held for its drop.
    _pooled: Option<Pooled>,
}

/// Storage bindings are read as whole 32-bit words, so byte data is padded to a multiple of 4.
fn padded_words(bytes: &[u8]) -> Vec<u8> {
    let mut padded = bytes.to_vec();
    padded.resize(bytes.len().next_multiple_of(4).max(4), 0);
    padded
}

impl Gpu {
    /// Copies `values` to a new device tensor.
    pub fn upload(&self, values: &[f32]) -> Result<GpuTensor> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let buffer = self.storage_with(bytes, "tensor")?;
        Ok(GpuTensor { buffer, len: values.len(), _pooled: None })
    }

    /// Copies `values` to a device tensor for the next submissions (a step's rotation table):
    /// a pooled buffer, filled as the next submission starts.
    pub(crate) fn upload_for_step(&self, values: &[f32]) -> Result<GpuTensor> {
        let (buffer, pooled) = self.filled_for_step(bytemuck::cast_slice(values), "tensor")?;
        Ok(GpuTensor { buffer, len: values.len(), _pooled: Some(pooled) })
    }

    /// Overwrites `tensor`'s values from `at` on with `values`, before the next submission
    /// runs (the caller keeps within the tensor).
    pub(crate) fn write(&self, tensor: &GpuTensor, at: usize, values: &[f32]) {
        self.queue.write_buffer(&tensor.buffer, (at * 4) as u64, bytemuck::cast_slice(values));
    }

    /// A device tensor of `len` zeros.
    pub fn zeros(&self, len: usize) -> Result<GpuTensor> {
        self.upload(&vec![0.0; len])
    }

    /// A device tensor of `len` values for a kernel to fill: made without a wait, inside a
    /// [`Gpu::run`] that reports any error of its making.
    /// Its values are whatever the pooled buffer held: kernels write every one they read.
    pub(crate) fn output(&self, len: usize) -> GpuTensor {
        let buffer = self.pool.take(&self.device, BufferKind::Storage, (len.max(1) * 4) as u64);
        let pooled = Pooled { pool: self.pool.clone(), buffer: buffer.clone() };
        GpuTensor { buffer, len, _pooled: Some(pooled) }
    }

    /// Copies a step's indices (token ids, block tables) to the device: a pooled buffer, filled
    /// as the next submission starts.
    pub(crate) fn upload_indices(&self, indices: &[u32], what: &str) -> Result<GpuBytes> {
        let (buffer, pooled) = self.filled_for_step(bytemuck::cast_slice(indices), what)?;
        Ok(GpuBytes { buffer, _pooled: Some(pooled) })
    }

    /// Copies raw bytes (a weight in its file layout) to the device.
    pub(crate) fn upload_bytes(&self, bytes: &[u8], what: &str) -> Result<GpuBytes> {
        Ok(GpuBytes { buffer: self.storage_with(&padded_words(bytes), what)?, _pooled: None })
    }

    /// A pooled buffer holding `bytes` (padded to whole words) from the next submission on.
    fn filled_for_step(&self, bytes: &[u8], what: &str) -> Result<(wgpu::Buffer, Pooled)> {
        let padded = padded_words(bytes);
        self.check_binding(padded.len(), what)?;
        let buffer = self.pool.take(&self.device, BufferKind::Storage, padded.len() as u64);
        self.queue.write_buffer(&buffer, 0, &padded);
        Ok((buffer.clone(), Pooled { pool: self.pool.clone(), buffer }))
    }

    /// Refuses `bytes` more than one binding holds.
    fn check_binding(&self, bytes: usize, what: &str) -> Result<()> {
        let limit = self.max_binding_bytes();
        if bytes as u64 > limit {
            return Err(GpuError::TooLarge { what: what.into(), bytes: bytes as u64, limit });
        }
        Ok(())
    }

    fn storage_with(&self, bytes: &[u8], what: &str) -> Result<wgpu::Buffer> {
        self.check_binding(bytes.len(), what)?;
        // An empty binding is invalid; a zero-length tensor still gets one word.
        let contents = if bytes.is_empty() { &[0u8; 4][..] } else { bytes };
        self.checked(|| {
            Ok(self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(what),
                contents,
                usage: BufferUsages::STORAGE | BufferUsages::COPY_SRC | BufferUsages::COPY_DST,
            }))
        })
    }
}
