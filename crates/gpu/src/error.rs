//! The one error type of the GPU crate.

/// Everything that can go wrong while opening a GPU or running a kernel on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No adapter at all, or not the one asked for; the message names what was tried and found.
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("the GPU adapter {adapter} refused a device: {reason}")]
    DeviceRefused { adapter: String, reason: String },
    /// Shapes or byte lengths that do not fit together; caught before anything is dispatched.
    #[error("bad kernel input: {0}")]
    BadInput(String),
    /// A buffer larger than one binding may be on this adapter (lavapipe: 128 MiB).
    #[error("{what} needs {bytes} bytes in one buffer binding; this adapter allows {limit}")]
    TooLarge { what: String, bytes: u64, limit: u64 },
    /// The device reported an error (validation, out of memory, device lost) for a submission.
    #[error("GPU error: {0}")]
    Device(String),
    /// A step's part that runs on the CPU (routed experts kept in system RAM) failed.
    #[error("{0}")]
    Host(String),
}

pub type Result<T> = std::result::Result<T, GpuError>;
