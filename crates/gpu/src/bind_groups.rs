//! Bind groups kept across steps. Making one per dispatch cost 15 µs of host time on lavapipe
//! (a hybrid MoE step has several hundred dispatches); a decode step binds the same pipelines
//! to the same buffers every time (pooled outputs and indices, the same parameter blocks), so
//! the group made for a dispatch the step before serves again. Groups unused for a while are
//! let go, and with them the buffers they hold.

use std::collections::HashMap;

/// Submissions a bind group may go unused before it is let go.
const UNUSED_SUBMISSIONS: u64 = 64;

/// A dispatch's bindings: its pipeline, its storage buffers in binding order, and its uniform
/// block (buffer, offset, size).
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct Bindings {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) storage: Vec<wgpu::Buffer>,
    pub(crate) uniform: (wgpu::Buffer, u64, u64),
}

#[derive(Default)]
pub(crate) struct BindGroups {
    /// Each group, with the submission that last used it.
    groups: HashMap<Bindings, (wgpu::BindGroup, u64)>,
    submissions: u64,
    made: u64,
    reused: u64,
}

/// Bind groups made and reused so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindGroupCount {
    pub made: u64,
    pub reused: u64,
}

impl BindGroups {
    /// The group for `bindings`: the one kept, or one `make` makes (then kept).
    pub(crate) fn get(
        &mut self,
        bindings: Bindings,
        make: impl FnOnce(&Bindings) -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        let now = self.submissions;
        if let Some((group, used)) = self.groups.get_mut(&bindings) {
            *used = now;
            self.reused += 1;
            return group.clone();
        }
        let group = make(&bindings);
        self.made += 1;
        self.groups.insert(bindings, (group.clone(), now));
        group
    }

    /// A submission went; groups unused for [`UNUSED_SUBMISSIONS`] are let go.
    pub(crate) fn submitted(&mut self) {
        self.submissions += 1;
        if self.submissions.is_multiple_of(UNUSED_SUBMISSIONS) {
            let oldest = self.submissions - UNUSED_SUBMISSIONS;
            self.groups.retain(|_, (_, used)| *used >= oldest);
        }
    }

    /// Lets every group go (a model's weights are being freed).
    pub(crate) fn clear(&mut self) {
        self.groups.clear();
    }

    pub(crate) fn count(&self) -> BindGroupCount {
        BindGroupCount { made: self.made, reused: self.reused }
    }
}
