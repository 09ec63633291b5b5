//! Device buffers kept for reuse across steps: a step's outputs, the indices and tables it
//! uploads, and its parameter blocks. A decode step makes the same buffers in the same order
//! every time, so taking them back from here (not made afresh) lets a dispatch bind the very
//! buffers it bound the step before, and its bind group be reused (`bind_groups`).
//!
//! A buffer dropped between steps is handed out again at once: every command that used it was
//! submitted already, so whatever uses it next (another step's commands, a fill from the host
//! with `queue.write_buffer`, which lands as the next submission starts) comes after. One
//! dropped while its thread records a step (a kernel's token ids, a temporary output) waits
//! until that thread has submitted: handed out at once, it could be filled, or written by
//! another thread's step submitted first, before its own step ran (this showed wrong logits on
//! lavapipe when several threads ran steps on one device). A step is recorded and submitted on
//! one thread, and its tensors are dropped there.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;

use wgpu::BufferUsages;

/// Bytes the pool keeps at most; a buffer given back past them is let go.
const POOL_BYTES: u64 = 256 << 20;

/// What a pooled buffer is for: its usages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum BufferKind {
    /// Written and read by kernels, copied from and to.
    Storage,
    /// A step's dispatch parameters.
    Uniform,
}

impl BufferKind {
    fn usage(self) -> BufferUsages {
        match self {
            BufferKind::Storage => {
                BufferUsages::STORAGE | BufferUsages::COPY_SRC | BufferUsages::COPY_DST
            }
            BufferKind::Uniform => BufferUsages::UNIFORM | BufferUsages::COPY_DST,
        }
    }
}

#[derive(Default)]
pub(crate) struct BufferPool {
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    /// Free buffers by kind and size.
    free: HashMap<(BufferKind, u64), Vec<wgpu::Buffer>>,
    /// Buffers dropped while their thread recorded a step, with that thread.
    parked: Vec<(ThreadId, BufferKind, wgpu::Buffer)>,
    /// Each buffer's place when last handed out: the how-many-th of its kind and size since
    /// its thread's last submission. A step that makes its buffers in the order the step
    /// before did gets the same ones back, place by place.
    places: HashMap<wgpu::Buffer, usize>,
    /// Bytes free and parked.
    bytes: u64,
}

impl BufferPool {
    /// A buffer of `size` bytes for `kind`: one given back, or a new one.
    pub(crate) fn take(&self, device: &wgpu::Device, kind: BufferKind, size: u64) -> wgpu::Buffer {
        let place = PLACES.with_borrow_mut(|places| {
            let next = places.entry((kind, size)).or_default();
            *next += 1;
            *next - 1
        });
        let mut state = self.lock();
        let PoolState { free, places, bytes, .. } = &mut *state;
        let list = free.entry((kind, size)).or_default();
        let same = list.iter().position(|b| places.get(b) == Some(&place));
        let buffer = match same.map(|i| list.swap_remove(i)).or_else(|| list.pop()) {
            Some(buffer) => {
                *bytes -= size;
                buffer
            }
            None => device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("pooled"),
                size,
                usage: kind.usage(),
                mapped_at_creation: false,
            }),
        };
        places.insert(buffer.clone(), place);
        buffer
    }

    /// `buffer` back for reuse: at once between steps, after this thread's next submission
    /// while it records one.
    pub(crate) fn give_back(&self, kind: BufferKind, buffer: wgpu::Buffer) {
        let mut state = self.lock();
        if state.bytes + buffer.size() > POOL_BYTES {
            state.places.remove(&buffer);
            return;
        }
        state.bytes += buffer.size();
        if RECORDING.get() > 0 {
            state.parked.push((std::thread::current().id(), kind, buffer));
        } else {
            state.free_again(kind, buffer);
        }
    }

    /// This thread submitted: the buffers it parked before may be handed out again, and its
    /// next buffers count their places afresh.
    pub(crate) fn submitted(&self) {
        PLACES.with_borrow_mut(HashMap::clear);
        let thread = std::thread::current().id();
        let mut state = self.lock();
        let (mine, others): (Vec<_>, Vec<_>) =
            std::mem::take(&mut state.parked).into_iter().partition(|p| p.0 == thread);
        state.parked = others;
        for (_, kind, buffer) in mine {
            state.free_again(kind, buffer);
        }
    }

    /// Bytes held for reuse.
    pub(crate) fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PoolState {
    fn free_again(&mut self, kind: BufferKind, buffer: wgpu::Buffer) {
        self.free.entry((kind, buffer.size())).or_default().push(buffer);
    }
}

thread_local! {
    /// Buffers this thread took since its last submission, by kind and size.
    static PLACES: RefCell<HashMap<(BufferKind, u64), usize>> = RefCell::default();
    /// Steps this thread is recording (a step may run another, such as a copy, inside).
    static RECORDING: Cell<usize> = const { Cell::new(0) };
}

/// While this lives, the thread records a step: buffers it drops wait for its submission.
pub(crate) struct Recording(());

impl Recording {
    pub(crate) fn start() -> Self {
        RECORDING.set(RECORDING.get() + 1);
        Recording(())
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        RECORDING.set(RECORDING.get() - 1);
    }
}
