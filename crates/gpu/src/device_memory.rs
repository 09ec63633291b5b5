//! The device memory an adapter has, which wgpu does not report: asked of the driver through
//! wgpu's HAL. On Vulkan, of the heaps the driver lists, the largest device-local one (a
//! discrete card's VRAM; system RAM on a CPU device such as lavapipe, or on an integrated GPU);
//! what is free of it now where the driver has VK_EXT_memory_budget (its budget less this
//! process's usage), else its whole size. On Metal, the device's recommended working set (what
//! macOS lets the GPU keep resident of the unified memory with good performance) less what this
//! process has allocated on it. DX12 reports nothing here: `None`.

use std::fmt;

/// One device heap's size and what is free of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The heap's size in bytes.
    pub total: u64,
    /// Bytes free now: the driver's budget less this process's usage, or `total` without
    /// VK_EXT_memory_budget.
    pub available: u64,
    /// Where the numbers come from.
    pub source: MemorySource,
    /// Whether `available` was measured (VK_EXT_memory_budget, Metal) rather than taken as
    /// `total`.
    pub measured: bool,
    /// Whether the heap is system RAM (a CPU device or an integrated GPU), so experts left in
    /// system RAM take from the same memory.
    pub system_ram: bool,
}

/// Which of the driver's numbers a [`DeviceMemory`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// A Vulkan memory heap, by its index.
    VulkanHeap(usize),
    /// Metal's `recommendedMaxWorkingSetSize`.
    MetalWorkingSet,
}

impl fmt::Display for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySource::VulkanHeap(heap) => write!(f, "Vulkan heap {heap}"),
            MemorySource::MetalWorkingSet => write!(f, "Metal working set"),
        }
    }
}

impl fmt::Display for DeviceMemory {
    /// `Vulkan heap 0: 900.0 MiB free of 1024.0 MiB`, with what qualifies it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "{}: {:.1} MiB free of {:.1} MiB",
            self.source,
            mib(self.available),
            mib(self.total)
        )?;
        if !self.measured {
            write!(f, ", taken as the heap's size without VK_EXT_memory_budget")?;
        }
        if self.system_ram {
            write!(f, ", system RAM shared with the CPU")?;
        }
        Ok(())
    }
}

/// The largest device-local heap of `adapter`, `None` where its backend is not Vulkan.
#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) fn of(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    use ash::vk;

    // SAFETY: the HAL adapter is only read from, while `adapter` keeps it alive.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let shared = hal.shared_instance();
    let instance = shared.raw_instance();
    let physical = hal.raw_physical_device();
    let capabilities = hal.physical_device_capabilities();
    let properties = capabilities.properties();
    let system_ram = matches!(
        properties.device_type,
        vk::PhysicalDeviceType::CPU | vk::PhysicalDeviceType::INTEGRATED_GPU
    );
    // The budget query is Vulkan 1.1's; wgpu-hal also hides the extension where a driver
    // misreports it (RADV at present), and `supports_extension` follows that.
    let budgeted = shared.instance_api_version() >= vk::API_VERSION_1_1
        && properties.api_version >= vk::API_VERSION_1_1
        && capabilities.supports_extension(ash::ext::memory_budget::NAME);
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let memory = if budgeted {
        let mut properties2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: `physical` is the live adapter's, and the chain is one valid budget struct.
        unsafe { instance.get_physical_device_memory_properties2(physical, &mut properties2) };
        properties2.memory_properties
    } else {
        // SAFETY: `physical` is the live adapter's.
        unsafe { instance.get_physical_device_memory_properties(physical) }
    };
    let heaps: Vec<(u64, bool)> = memory
        .memory_heaps_as_slice()
        .iter()
        .map(|h| (h.size, h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL)))
        .collect();
    let free = budgeted.then_some((&budget.heap_budget[..], &budget.heap_usage[..]));
    largest_device_local(&heaps, free, system_ram)
}

/// The working set Metal recommends for `adapter`'s device, less what this process allocated
/// on it; `None` where the backend is not Metal.
#[cfg(target_vendor = "apple")]
pub(crate) fn of(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    use objc2_metal::MTLDevice;

    // SAFETY: the HAL adapter is only read from, while `adapter` keeps it alive.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Metal>() }?;
    let device = hal.raw_device();
    let total = device.recommendedMaxWorkingSetSize();
    let allocated = device.currentAllocatedSize() as u64;
    Some(working_set(total, allocated, device.hasUnifiedMemory()))
}

/// Other platforms have no such query here.
#[cfg(not(any(
    windows,
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd",
    target_vendor = "apple"
)))]
pub(crate) fn of(_adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    None
}

/// Metal's recommended working set `total`, of which `allocated` is taken already.
#[cfg_attr(not(target_vendor = "apple"), allow(dead_code))]
fn working_set(total: u64, allocated: u64, unified: bool) -> DeviceMemory {
    DeviceMemory {
        total,
        available: total.saturating_sub(allocated),
        source: MemorySource::MetalWorkingSet,
        measured: true,
        system_ram: unified,
    }
}

/// Of `heaps` (size, device-local), the largest device-local one; free is its budget less its
/// usage where `budget` gives them per heap, else its size.
#[cfg_attr(target_vendor = "apple", allow(dead_code))]
fn largest_device_local(
    heaps: &[(u64, bool)],
    budget: Option<(&[u64], &[u64])>,
    system_ram: bool,
) -> Option<DeviceMemory> {
    let (heap, &(total, _)) =
        heaps.iter().enumerate().filter(|(_, h)| h.1).max_by_key(|(_, h)| h.0)?;
    let available = match budget {
        // A budget can exceed the heap (drivers estimate it), never what is there.
        Some((budgets, usages)) => budgets[heap].saturating_sub(usages[heap]).min(total),
        None => total,
    };
    let source = MemorySource::VulkanHeap(heap);
    Some(DeviceMemory { total, available, source, measured: budget.is_some(), system_ram })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_device_local_heap_is_taken_and_its_budget_less_usage_is_free() {
        // A discrete card: a host heap, a small device-local window, the VRAM.
        let heaps = [(64 << 30, false), (256 << 20, true), (8 << 30, true)];
        let budget = [60 << 30, 200 << 20, 7 << 30];
        let usage = [1 << 30, 0, 2 << 30];
        let memory = largest_device_local(&heaps, Some((&budget, &usage)), false).unwrap();
        assert_eq!(memory.source, MemorySource::VulkanHeap(2));
        assert_eq!((memory.total, memory.available), (8 << 30, 5 << 30));
        assert!(memory.measured);
        // Without VK_EXT_memory_budget, the heap's size.
        let memory = largest_device_local(&heaps, None, false).unwrap();
        assert_eq!((memory.available, memory.measured), (8 << 30, false));
        let line = memory.to_string();
        assert_eq!(
            line,
            "Vulkan heap 2: 8192.0 MiB free of 8192.0 MiB, taken as the heap's size without \
             VK_EXT_memory_budget"
        );
        // Usage past the budget is nothing free, and a budget past the heap is the heap.
        let memory = largest_device_local(&heaps, Some((&[0, 0, 1], &[0, 0, 5])), false).unwrap();
        assert_eq!(memory.available, 0);
        let memory = largest_device_local(&heaps, Some((&[0, 0, 9 << 30], &[0; 3])), true);
        assert_eq!(memory.unwrap().available, 8 << 30);
        assert!(memory.unwrap().to_string().ends_with(", system RAM shared with the CPU"));
        assert_eq!(largest_device_local(&[(1 << 30, false)], None, false), None);
    }

    #[test]
    fn metals_working_set_less_what_is_allocated_is_free() {
        let memory = working_set(48 << 30, 2 << 30, true);
        assert_eq!((memory.total, memory.available), (48 << 30, 46 << 30));
        assert_eq!(
            memory.to_string(),
            "Metal working set: 47104.0 MiB free of 49152.0 MiB, system RAM shared with the CPU"
        );
        // More allocated than recommended: nothing free.
        assert_eq!(working_set(1 << 30, 3 << 30, true).available, 0);
    }
}
