//! Recording many kernels into one command buffer and submitting it once: a model step is
//! hundreds of dispatches, and a submission (with its wait) per kernel would cost more than the
//! kernels on a GPU.

use wgpu::BufferUsages;

use crate::buffer::GpuTensor;
use crate::buffer_pool::{BufferKind, Recording};
use crate::device::Gpu;
use crate::error::{GpuError, Result};

/// Bytes of one buffer of a step's dispatch parameters (a few hundred dispatches' blocks).
const PARAMS_BUFFER: usize = 64 << 10;

/// Work being recorded for one submission. Kernels add their dispatches to it in order; each
/// sees the results of those before it.
pub struct Step<'g> {
    pub(crate) gpu: &'g Gpu,
    pub(crate) encoder: wgpu::CommandEncoder,
    readbacks: Vec<wgpu::Buffer>,
    /// The dispatches' parameter blocks, side by side in a few uniform buffers written once as
    /// the step is submitted: a buffer made for each dispatch cost more than the dispatch's
    /// recording (36 µs of ~50 on lavapipe's host side).
    params: Vec<(wgpu::Buffer, Vec<u8>)>,
    /// Buffers dropped meanwhile wait for the submission (`buffer_pool`).
    _recording: Recording,
}

/// A tensor's values as they will be after the step: readable once [`Gpu::run`] returns.
pub struct Readback {
    buffer: wgpu::Buffer,
    len: usize,
}

impl Gpu {
    /// Records `work` into one command buffer, submits it once and waits for it. An `Err` from
    /// `work` submits nothing; a device error during the step is an `Err` too.
    pub fn run<T>(&self, work: impl FnOnce(&mut Step<'_>) -> Result<T>) -> Result<T> {
        self.checked(|| {
            let mut step = Step::new(self);
            let result = work(&mut step)?;
            for buffer in step.submit() {
                buffer.slice(..).map_async(wgpu::MapMode::Read, |_| ());
            }
            Ok(result)
        })
    }

    /// Records `work` into one command buffer and submits it without waiting: the device runs
    /// it while the host goes on, and later submissions run after it. Errors of its making are
    /// an `Err` as in [`Gpu::run`]; it reads nothing back (nothing would wait for it).
    pub fn submit<T>(&self, work: impl FnOnce(&mut Step<'_>) -> Result<T>) -> Result<T> {
        self.scoped(false, || {
            let mut step = Step::new(self);
            let result = work(&mut step)?;
            if !step.readbacks.is_empty() {
                return Err(GpuError::BadInput(
                    "a submission nothing waits for reads nothing back".into(),
                ));
            }
            step.submit();
            Ok(result)
        })
    }

    /// Copies a device tensor back to the host (a step of its own).
    pub fn download(&self, tensor: &GpuTensor) -> Result<Vec<f32>> {
        self.run(|step| Ok(step.read(tensor)))?.values()
    }
}

impl<'g> Step<'g> {
    fn new(gpu: &'g Gpu) -> Self {
        let encoder = gpu.device.create_command_encoder(&Default::default());
        let _recording = Recording::start();
        Step { gpu, encoder, readbacks: Vec::new(), params: Vec::new(), _recording }
    }

    /// Writes the parameter blocks and submits the recorded work; the buffers to read back.
    /// The parameter buffers go back to the pool, the first taken first again next step (so
    /// its dispatches bind what they bound this one).
    fn submit(self) -> Vec<wgpu::Buffer> {
        for (buffer, bytes) in &self.params {
            self.gpu.queue.write_buffer(buffer, 0, bytes);
        }
        self.gpu.queue.submit([self.encoder.finish()]);
        for (buffer, _) in self.params.into_iter().rev() {
            self.gpu.pool.give_back(BufferKind::Uniform, buffer);
        }
        self.gpu.count_submission();
        self.readbacks
    }

    /// A tensor of `len` zeros when the step reaches this point (a sum to add into).
    pub(crate) fn zeros(&mut self, len: usize) -> GpuTensor {
        let tensor = self.gpu.output(len);
        self.encoder.clear_buffer(&tensor.buffer, 0, None);
        tensor
    }
}

impl Step<'_> {
    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    /// A uniform binding that holds `words` when the step runs: a block in one of the step's
    /// parameter buffers, at the device's alignment.
    pub(crate) fn params(&mut self, words: &[u32]) -> (wgpu::Buffer, u64, u64) {
        let bytes: &[u8] = bytemuck::cast_slice(words);
        // Uniform blocks are 16-byte multiples.
        let size = bytes.len().next_multiple_of(16).max(16);
        let align = self.gpu.uniform_alignment() as usize;
        let full = |(_, data): &(wgpu::Buffer, Vec<u8>)| {
            data.len().next_multiple_of(align) + size > PARAMS_BUFFER
        };
        if self.params.last().is_none_or(full) {
            let (device, kind) = (&self.gpu.device, BufferKind::Uniform);
            let buffer = self.gpu.pool.take(device, kind, PARAMS_BUFFER as u64);
            self.params.push((buffer, Vec::new()));
        }
        let (buffer, data) = self.params.last_mut().expect("a parameter buffer");
        let offset = data.len().next_multiple_of(align);
        data.resize(offset, 0);
        data.extend_from_slice(bytes);
        data.resize(offset + size, 0);
        (buffer.clone(), offset as u64, size as u64)
    }

    /// Copies `tensor`'s values as they are at this point of the step to the host.
    pub fn read(&mut self, tensor: &GpuTensor) -> Readback {
        self.read_values(tensor, 0, tensor.len())
    }

    /// Copies values `from..from + len` of `tensor` as they are at this point of the step to
    /// the host.
    pub(crate) fn read_range(
        &mut self,
        tensor: &GpuTensor,
        from: usize,
        len: usize,
    ) -> Result<Readback> {
        if from + len > tensor.len() {
            return Err(GpuError::BadInput(format!(
                "{len} values from {from} of {}",
                tensor.len()
            )));
        }
        Ok(self.read_values(tensor, from, len))
    }

    fn read_values(&mut self, tensor: &GpuTensor, from: usize, len: usize) -> Readback {
        let size = (len.max(1) * 4) as u64;
        let buffer = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: BufferUsages::MAP_READ | BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if len > 0 {
            let bytes = (len * 4) as u64;
            self.encoder.copy_buffer_to_buffer(
                &tensor.buffer,
                (from * 4) as u64,
                &buffer,
                0,
                bytes,
            );
        }
        self.readbacks.push(buffer.clone());
        Readback { buffer, len }
    }

    /// Copies values `from..from + len` of `src` to `dst` from value `to` on.
    pub fn copy(
        &mut self,
        src: &GpuTensor,
        from: usize,
        dst: &GpuTensor,
        to: usize,
        len: usize,
    ) -> Result<()> {
        if from + len > src.len() || to + len > dst.len() {
            return Err(GpuError::BadInput(format!(
                "{len} values from {from} of {} to {to} of {}",
                src.len(),
                dst.len()
            )));
        }
        let (from, to, bytes) = ((from * 4) as u64, (to * 4) as u64, (len * 4) as u64);
        self.encoder.copy_buffer_to_buffer(&src.buffer, from, &dst.buffer, to, bytes);
        Ok(())
    }
}

impl Step<'_> {
    /// The rows `wanted` (first row, rows) of `x` (rows of `width`), one range after another.
    pub(crate) fn gather_rows(
        &mut self,
        x: &GpuTensor,
        width: usize,
        wanted: &[(usize, usize)],
    ) -> Result<GpuTensor> {
        let picked = self.gpu.output(wanted.iter().map(|w| w.1).sum::<usize>() * width);
        let mut at = 0;
        for &(first, rows) in wanted {
            self.copy(x, first * width, &picked, at, rows * width)?;
            at += rows * width;
        }
        Ok(picked)
    }
}

/// Rows of `width` read back for the ranges `wanted` (as [`Step::gather_rows`] picked them),
/// split again: one vector per range.
pub(crate) fn rows_per_range(
    values: &[f32],
    width: usize,
    wanted: &[(usize, usize)],
) -> Vec<Vec<f32>> {
    let mut rows = values.chunks_exact(width);
    wanted.iter().map(|&(_, n)| rows.by_ref().take(n).flatten().copied().collect()).collect()
}

impl Readback {
    /// The values as the u32 words they are (expert ids), once the step that read them has run.
    pub(crate) fn words(self) -> Result<Vec<u32>> {
        Ok(self.values()?.into_iter().map(f32::to_bits).collect())
    }

    /// The values, once the step that read them has run.
    pub fn values(self) -> Result<Vec<f32>> {
        let view = self
            .buffer
            .slice(..)
            .get_mapped_range()
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let values = bytemuck::cast_slice::<u8, f32>(&view)[..self.len].to_vec();
        drop(view);
        self.buffer.unmap();
        Ok(values)
    }
}
