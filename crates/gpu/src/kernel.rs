//! A compiled compute shader and its dispatch into a [`Step`]: storage buffers bound in order,
//! then one uniform block of 32-bit parameters.

use std::num::NonZeroU64;

use crate::bind_groups::Bindings;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::step::Step;

/// Workgroups along x at most; more go along y (every adapter allows 65,535 per dimension).
pub(crate) const GRID_X: u32 = 32768;

/// One compute pipeline (entry point `main`).
pub(crate) struct Kernel {
    name: &'static str,
    pipeline: wgpu::ComputePipeline,
}

impl Kernel {
    /// Compiles `source`, or takes the pipeline this device already compiled from it; a shader
    /// the device refuses is an `Err` naming the kernel.
    pub(crate) fn new(gpu: &Gpu, name: &'static str, source: &str) -> Result<Kernel> {
        let compiled = gpu.pipelines.lock().unwrap_or_else(|e| e.into_inner()).get(source).cloned();
        let pipeline = match compiled {
            Some(pipeline) => pipeline,
            // Compiled without the lock held, so that threads compile different kernels at
            // once; two compiling the same one keep either.
            None => {
                let pipeline = compile(gpu, name, source)?;
                gpu.pipelines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(source.to_owned(), pipeline.clone());
                pipeline
            }
        };
        Ok(Kernel { name, pipeline })
    }

    /// Records `workgroups` (a count laid out by [`GRID_X`] on x and y, and `z`) over
    /// `buffers` (bindings 0..) and `params` (the binding after them) into `step`.
    pub(crate) fn record(
        &self,
        step: &mut Step<'_>,
        buffers: &[&wgpu::Buffer],
        params: &[u32],
        (workgroups, z): (u32, u32),
    ) {
        if workgroups == 0 || z == 0 {
            return;
        }
        let bindings = Bindings {
            pipeline: self.pipeline.clone(),
            storage: buffers.iter().map(|&b| b.clone()).collect(),
            uniform: step.params(params),
        };
        let make = |b: &Bindings| {
            let (uniform, offset, size) = &b.uniform;
            let uniform = wgpu::BufferBinding {
                buffer: uniform,
                offset: *offset,
                size: NonZeroU64::new(*size),
            };
            let entries: Vec<wgpu::BindGroupEntry> = (b.storage.iter())
                .map(|b| b.as_entire_binding())
                .chain([wgpu::BindingResource::Buffer(uniform)])
                .enumerate()
                .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource })
                .collect();
            step.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(self.name),
                layout: &self.pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        };
        let bind_group = step.gpu.bind_groups().get(bindings, make);
        let mut pass = step.encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(workgroups.min(GRID_X), workgroups.div_ceil(GRID_X), z);
    }
}

fn compile(gpu: &Gpu, name: &'static str, source: &str) -> Result<wgpu::ComputePipeline> {
    gpu.checked(|| {
        let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        Ok(gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        }))
    })
    .map_err(|e| GpuError::Device(format!("kernel {name} did not compile: {e}")))
}

/// A count as a `u32` for the device, or an error naming what overflowed.
pub(crate) fn count(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| GpuError::BadInput(format!("{what} ({n}) exceeds 2^32 - 1")))
}
