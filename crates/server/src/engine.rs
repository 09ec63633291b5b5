//! The engine as the handlers see it: a request goes in with its caller, and its events come
//! back on the caller's channel. The model-backed engine thread of `spindle-runner` is one such
//! engine; tests script another, so every route can run without a model.

use spindle_runner::{Caller, Engine, EngineHealth, EngineLoad, EngineStopped, SequenceRequest};

/// What the server needs of an engine.
pub trait GenerationEngine: Send + Sync {
    /// Queues `request`. Its events go to `caller` in order: prompt progress, tokens, then one
    /// `Finished` or `Failed`; a token only while `caller.ready()` (the client has read enough),
    /// and a cancel or a dropped receiver ends it.
    fn submit(&self, request: SequenceRequest, caller: Caller) -> Result<(), EngineStopped>;

    /// Gauges and counters, for `/metrics` and for the batch worker's idle check.
    fn load(&self) -> &EngineLoad;

    /// Whether the engine still runs: once a fault stops it, `/health` answers 503 and
    /// [`crate::serve`] returns an error, so a supervisor restarts the process.
    fn health(&self) -> EngineHealth;
}

impl GenerationEngine for Engine {
    fn submit(&self, request: SequenceRequest, caller: Caller) -> Result<(), EngineStopped> {
        Engine::submit(self, request, caller)
    }

    fn load(&self) -> &EngineLoad {
        Engine::load(self)
    }

    fn health(&self) -> EngineHealth {
        Engine::health(self)
    }
}
