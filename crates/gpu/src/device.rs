//! Finding an adapter and opening a device on it.
//!
//! Adapters are looked for on the native backends wgpu was built with here (Vulkan; Metal on
//! macOS; DX12 on Windows). A machine without a GPU still has one when Mesa's lavapipe (a Vulkan
//! driver that runs on the CPU) is installed, which is how CI runs every kernel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::{AdapterInfo, Backends, DeviceType};

use crate::bind_groups::{BindGroupCount, BindGroups};
use crate::buffer_pool::BufferPool;
use crate::error::{GpuError, Result};

/// The backends searched for adapters.
const BACKENDS: Backends = Backends::VULKAN.union(Backends::METAL).union(Backends::DX12);

/// An opened device and its queue, with what was found about its adapter.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    adapter: AdapterSummary,
    /// Kept to ask its driver for the device's memory.
    raw_adapter: wgpu::Adapter,
    limits: wgpu::Limits,
    submissions: AtomicU64,
    /// Pipelines compiled on this device, by shader source: every model loaded on it (and every
    /// test sharing it) compiles a kernel once; a driver may take a second to compile one.
    pub(crate) pipelines: Mutex<HashMap<String, wgpu::ComputePipeline>>,
    /// Buffers the steps make for themselves, kept for the next steps.
    pub(crate) pool: Arc<BufferPool>,
    /// Bind groups kept across steps.
    pub(crate) bind_groups: Mutex<BindGroups>,
}

/// One adapter as a user would pick it: its index in [`Gpu::adapters`] and its description.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub index: usize,
    pub info: AdapterInfo,
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.info;
        write!(
            f,
            "[{}] {} ({:?}, {:?}, {})",
            self.index, i.name, i.backend, i.device_type, i.driver_info
        )
    }
}

impl Gpu {
    /// Every adapter of the searched backends, in the order `open` numbers them.
    pub fn adapters() -> Vec<AdapterSummary> {
        enumerate(&instance())
            .iter()
            .enumerate()
            .map(|(index, a)| AdapterSummary { index, info: a.get_info() })
            .collect()
    }

    /// Opens adapter `index` of [`Gpu::adapters`], or the first real GPU when `None` (a CPU
    /// implementation such as lavapipe only when there is nothing else).
    pub fn open(index: Option<usize>) -> Result<Gpu> {
        let instance = instance();
        let mut adapters = enumerate(&instance);
        let summaries: Vec<String> = adapters
            .iter()
            .enumerate()
            .map(|(index, a)| AdapterSummary { index, info: a.get_info() }.to_string())
            .collect();
        if adapters.is_empty() {
            return Err(GpuError::NoAdapter(format!(
                "none found through {} (on Linux without a GPU, Debian's mesa-vulkan-drivers \
                 provides lavapipe, a Vulkan driver on the CPU)",
                backends_tried()
            )));
        }
        let chosen = match index {
            Some(i) if i < adapters.len() => i,
            Some(i) => {
                return Err(GpuError::NoAdapter(format!(
                    "adapter {i} was asked for; found {}: {}",
                    adapters.len(),
                    summaries.join("; ")
                )))
            }
            None => adapters
                .iter()
                .position(|a| a.get_info().device_type != DeviceType::Cpu)
                .unwrap_or(0),
        };
        let adapter = adapters.swap_remove(chosen);
        let summary = AdapterSummary { index: chosen, info: adapter.get_info() };
        // Everything the adapter allows: weights want the largest bindings it has.
        let limits = adapter.limits();
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("spindle"),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&descriptor)).map_err(|e| {
                GpuError::DeviceRefused {
                    adapter: summaries[chosen].clone(),
                    reason: e.to_string(),
                }
            })?;
        // Errors outside a `checked` call (none are expected) are printed, never a panic.
        device.on_uncaptured_error(std::sync::Arc::new(|e| eprintln!("GPU error: {e}")));
        Ok(Gpu {
            device,
            queue,
            adapter: summary,
            raw_adapter: adapter,
            limits,
            submissions: AtomicU64::new(0),
            pipelines: Mutex::default(),
            pool: Arc::default(),
            bind_groups: Mutex::default(),
        })
    }

    pub fn info(&self) -> &AdapterInfo {
        &self.adapter.info
    }

    /// The opened adapter with its index, as `--device gpu:N` names it.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.adapter
    }

    /// The device's memory and what is free of it now, asked of the driver at each call (see
    /// `device_memory`); `None` where the backend does not say (DX12).
    pub fn memory(&self) -> Option<crate::DeviceMemory> {
        crate::device_memory::of(&self.raw_adapter)
    }

    /// Command buffers submitted so far (a model step is one).
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// A submission went: counted, and what waited for one ([`BufferPool::submitted`],
    /// [`BindGroups::submitted`]) moves on.
    pub(crate) fn count_submission(&self) {
        self.submissions.fetch_add(1, Ordering::Relaxed);
        self.pool.submitted();
        self.bind_groups().submitted();
    }

    pub(crate) fn bind_groups(&self) -> std::sync::MutexGuard<'_, BindGroups> {
        self.bind_groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bind groups made and reused so far (a step in its steady state makes none).
    pub fn bind_group_count(&self) -> BindGroupCount {
        self.bind_groups().count()
    }

    /// Lets go of the bind groups kept, and the buffers they hold (a model unloading).
    pub fn forget_bind_groups(&self) {
        self.bind_groups().clear();
    }

    /// Bytes of buffers kept for the next steps.
    pub fn pooled_bytes(&self) -> u64 {
        self.pool.bytes()
    }

    /// The alignment of a uniform binding's offset in its buffer.
    pub(crate) fn uniform_alignment(&self) -> u64 {
        self.limits.min_uniform_buffer_offset_alignment as u64
    }

    /// The most bytes one storage binding may hold on this device.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }

    /// Runs `work` (resource creation, submissions), waits for the device to finish it, and
    /// returns the first validation or out-of-memory error it caused as an `Err`.
    pub(crate) fn checked<T>(&self, work: impl FnOnce() -> Result<T>) -> Result<T> {
        self.scoped(true, work)
    }

    /// Runs `work` and returns the first validation or out-of-memory error it caused as an
    /// `Err`, waiting for the device to finish it only when `wait` (native backends report
    /// those errors as the work is recorded and submitted, not as it runs).
    pub(crate) fn scoped<T>(&self, wait: bool, work: impl FnOnce() -> Result<T>) -> Result<T> {
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let result = work();
        let waited = if wait {
            self.device.poll(wgpu::PollType::wait_indefinitely()).map(drop)
        } else {
            Ok(())
        };
        let errors = [pollster::block_on(validation.pop()), pollster::block_on(memory.pop())];
        if let Some(e) = errors.into_iter().flatten().next() {
            return Err(GpuError::Device(e.to_string()));
        }
        waited.map_err(|e| GpuError::Device(e.to_string()))?;
        result
    }
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: BACKENDS,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

/// The searched backends this build has, by name ("Vulkan" on Linux).
fn backends_tried() -> String {
    let built = BACKENDS & wgpu::Instance::enabled_backend_features();
    let names =
        [(Backends::VULKAN, "Vulkan"), (Backends::METAL, "Metal"), (Backends::DX12, "DX12")];
    let tried: Vec<&str> =
        names.iter().filter(|(b, _)| built.contains(*b)).map(|&(_, name)| name).collect();
    if tried.is_empty() {
        "no backend (none is built for this platform)".into()
    } else {
        tried.join(", ")
    }
}

fn enumerate(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(BACKENDS))
}
