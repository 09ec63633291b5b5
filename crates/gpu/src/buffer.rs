//! f32 tensors and raw weight bytes in device memory, and copies to and from the host.

use wgpu::util::DeviceExt;
use wgpu::BufferUsages;

use crate::device::Gpu;
use crate::error::{GpuError, Result};

/// A row-major block of f32 values on the device.
pub struct GpuTensor {
    pub(crate) buffer: wgpu::Buffer,
    len: usize,
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

/// Bytes as the device stores them for one binding (weights in their file layout).
pub(crate) struct GpuBytes {
    pub(crate) buffer: wgpu::Buffer,
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
        Ok(GpuTensor { buffer, len: values.len() })
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
    pub(crate) fn output(&self, len: usize) -> GpuTensor {
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("output"),
            size: (len.max(1) * 4) as u64,
            usage: BufferUsages::STORAGE | BufferUsages::COPY_SRC | BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        GpuTensor { buffer, len }
    }

    /// Copies indices (token ids, block tables) to the device.
    pub(crate) fn upload_indices(&self, indices: &[u32], what: &str) -> Result<GpuBytes> {
        self.upload_bytes(bytemuck::cast_slice(indices), what)
    }

    /// Copies raw bytes (a weight in its file layout) to the device.
    pub(crate) fn upload_bytes(&self, bytes: &[u8], what: &str) -> Result<GpuBytes> {
        Ok(GpuBytes { buffer: self.storage_with(&padded_words(bytes), what)? })
    }

    fn storage_with(&self, bytes: &[u8], what: &str) -> Result<wgpu::Buffer> {
        let limit = self.max_binding_bytes();
        if bytes.len() as u64 > limit {
            return Err(GpuError::TooLarge { what: what.into(), bytes: bytes.len() as u64, limit });
        }
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
