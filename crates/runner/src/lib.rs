//! Turns token ids into generated tokens: the model step, the sampler, the engine thread that
//! runs many requests at once (also the one plain generation of the command line), and the
//! prefix cache (in memory, and optionally on disk).

mod blocking;
mod bundle;
mod disk_tier;
mod draft;
mod engine;
mod engine_load;
mod error;
mod events;
mod kv_events;
pub mod model_sampling;
mod mtp_drafter;
mod output;
mod polling_workers;
mod prefix_cache;
mod request;
pub mod sampler;
mod sequence;
pub mod speed;
mod window_rows;

pub use blocking::{single_sequence_cache, GenerationStats};
pub use bundle::{model_fingerprint, ModelBundle};
pub use disk_tier::DiskConfig;
pub use draft::{share_rollback_memory, DraftModel, DraftScript, RollbackShare};
pub use engine::{
    Engine, EngineConfig, EngineHealth, FaultInjection, SpeculationConfig, StepStage,
};
pub use engine_load::{EngineLoad, MAX_DRAFT};
pub use error::{EngineStopped, Result, RunnerError};
pub use events::{
    sequence_channel, Caller, Canceller, ClientGone, FinishReason, SequenceEvent, SequenceEvents,
    SequenceSummary, EVENT_CAPACITY,
};
pub use kv_events::KvEventsOut;
pub use output::{OutputPipeline, ReasoningMode, TextDelta};
pub use prefix_cache::CacheConfig;
pub use request::{ReasoningBudget, SequenceRequest};
