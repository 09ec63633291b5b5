//! The models a server can serve, and which of them are loaded: a request names a model, the
//! registry hands back a lease on it, loading it first when it is not loaded. Loads stay within
//! a memory budget: when one would not fit, the least recently used idle model is unloaded
//! first; a model with requests in flight is never unloaded, and when nothing can be freed the
//! request is refused with the reason. Idle models unload after their time-to-live.
//!
//! Like llama-server's router mode and LM Studio's just-in-time loading. The registry knows
//! nothing of engines: what a load makes is a `T` from the loader it is given (the server's
//! loads a model and starts its engine; tests give scripted ones), and time comes from a
//! [`Clock`] (tests drive theirs by hand), so every decision is tested without a model and
//! without waiting.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use spindle_runner::model_sampling::ModelSampling;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the log tells that a load goes on.
const LOAD_PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// A model the server can serve.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelEntry {
    /// The name clients pass as `model`.
    pub name: String,
    /// What the loader is given: a catalogue name, a file or a folder.
    pub source: String,
    /// Memory it takes once loaded (weights and KV pool), counted against the budget.
    pub bytes: u64,
    /// The sampling settings its files publish, read before any load (empty for a catalogue
    /// model not downloaded yet).
    pub sampling: ModelSampling,
}

/// Monotonic time, as the registry reads it.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed start.
    fn now(&self) -> Duration;
}

/// The process's monotonic clock.
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// Makes a loaded model from its entry (blocking: it reads weights); the error is shown to the
/// client whose request asked for the load.
pub type Loader<T> = Arc<dyn Fn(&ModelEntry) -> Result<T, String> + Send + Sync>;

/// Why a model could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("the model `{name}` does not exist; this server serves {}", quoted(served))]
    NotFound { name: String, served: Vec<String> },
    #[error(
        "loading `{name}` needs {needed} bytes but {free} of the {budget}-byte --models-memory \
         are free, and the other models loaded ({}) have requests in flight",
        quoted(busy)
    )]
    NoRoom { name: String, needed: u64, free: u64, budget: u64, busy: Vec<String> },
    #[error("loading `{name}` failed: {reason}")]
    LoadFailed { name: String, reason: String },
}

fn quoted(names: &[String]) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// One model's state as `/v1/models` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadState {
    Unloaded,
    Loading,
    Loaded,
}

impl LoadState {
    /// As `/v1/models` writes it (LM Studio's words).
    pub fn name(self) -> &'static str {
        match self {
            Self::Unloaded => "not-loaded",
            Self::Loading => "loading",
            Self::Loaded => "loaded",
        }
    }
}

enum Slot<T> {
    Unloaded,
    Loading,
    Loaded(Loaded<T>),
}

struct Loaded<T> {
    value: Arc<T>,
    in_flight: usize,
    /// When a lease was last taken or given back: idle time counts from here.
    last_used: Duration,
    /// Unloaded once idle this long (`None`: never).
    ttl: Option<Duration>,
    /// Loaded before the server started: never unloaded, whatever a request's `ttl` says.
    pinned: bool,
}

/// The served models and the loaded ones.
pub struct ModelRegistry<T> {
    /// In the order given; the first is the model of a request that names none.
    entries: Vec<ModelEntry>,
    /// Memory all loaded (and loading) models may take together.
    budget: u64,
    /// `--model-ttl` (`None`: never unload an idle model).
    default_ttl: Option<Duration>,
    loader: Loader<T>,
    clock: Arc<dyn Clock>,
    /// One per entry, in the same order.
    slots: Mutex<Vec<Slot<T>>>,
    /// Counts the loads ended, for requests waiting on one: a receiver subscribed before it
    /// reads the state misses no end.
    loads_ended: watch::Sender<u64>,
    /// Run once an unloaded model has been dropped (the server hands freed memory back to the
    /// OS there).
    unloaded: Option<UnloadHook>,
}

/// See [`ModelRegistry::with_unload_hook`].
pub type UnloadHook = Arc<dyn Fn() + Send + Sync>;

/// A loaded model in use by one request; giving it back (dropping it) marks the model idle
/// from then.
pub struct Lease<T> {
    registry: Arc<ModelRegistry<T>>,
    index: usize,
    value: Arc<T>,
}

impl<T> std::ops::Deref for Lease<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> Lease<T> {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.registry.entries[self.index].name
    }
}

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        let now = self.registry.clock.now();
        if let Slot::Loaded(loaded) = &mut self.registry.slots()[self.index] {
            loaded.in_flight -= 1;
            loaded.last_used = now;
        }
    }
}

/// A model asked for: leased now, or once its load ends.
pub enum Acquisition<T> {
    Ready(Lease<T>),
    Loading(LoadWait<T>),
}

/// A request waiting for its model to load (started by it or by an earlier request).
pub struct LoadWait<T> {
    registry: Arc<ModelRegistry<T>>,
    index: usize,
    ttl: Option<Option<Duration>>,
    /// The load this request started; `None` when it joined another's.
    load: Option<JoinHandle<Result<Lease<T>, RegistryError>>>,
    loads_ended: watch::Receiver<u64>,
}

impl<T: Send + Sync + 'static> LoadWait<T> {
    /// The model's name.
    pub fn name(&self) -> &str {
        &self.registry.entries[self.index].name
    }

    /// The lease once the load ends; the load's error when it fails, and when another
    /// request's load failed, what trying again gives.
    pub async fn finish(mut self) -> Result<Lease<T>, RegistryError> {
        loop {
            if let Some(load) = self.load.take() {
                let stopped = |e| {
                    Err(self.registry.load_failed(self.index, format!("the load stopped: {e}")))
                };
                return load.await.unwrap_or_else(stopped);
            }
            // The sender lives as long as the registry this holds.
            let _ = self.loads_ended.changed().await;
            match self.registry.step(self.index, self.ttl)? {
                Acquisition::Ready(lease) => return Ok(lease),
                Acquisition::Loading(wait) => self = wait,
            }
        }
    }
}

impl<T: Send + Sync + 'static> ModelRegistry<T> {
    /// A registry of `entries` (at least one), none loaded yet.
    pub fn new(
        entries: Vec<ModelEntry>,
        budget: u64,
        default_ttl: Option<Duration>,
        loader: Loader<T>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        assert!(!entries.is_empty(), "a registry serves at least one model");
        let slots = entries.iter().map(|_| Slot::Unloaded).collect();
        Arc::new(Self {
            entries,
            budget,
            default_ttl,
            loader,
            clock,
            slots: Mutex::new(slots),
            loads_ended: watch::Sender::new(0),
            unloaded: None,
        })
    }

    /// The registry of [`new`](Self::new) that runs `hook` each time an unloaded model has
    /// been dropped, off the async threads.
    pub fn with_unload_hook(
        entries: Vec<ModelEntry>,
        budget: u64,
        default_ttl: Option<Duration>,
        loader: Loader<T>,
        clock: Arc<dyn Clock>,
        hook: UnloadHook,
    ) -> Arc<Self> {
        let mut registry = Self::new(entries, budget, default_ttl, loader, clock);
        Arc::get_mut(&mut registry).expect("not shared yet").unloaded = Some(hook);
        registry
    }

    /// Marks entry `index` loaded with `value`, never to be unloaded for idleness (a model
    /// loaded before the server starts).
    pub fn preload(&self, index: usize, value: T) {
        let now = self.clock.now();
        let loaded = Loaded {
            value: Arc::new(value),
            in_flight: 0,
            last_used: now,
            ttl: None,
            pinned: true,
        };
        self.slots()[index] = Slot::Loaded(loaded);
    }

    /// The served models in order, each with its state.
    pub fn list(&self) -> Vec<(ModelEntry, LoadState)> {
        let slots = self.slots();
        let state = |slot: &Slot<T>| match slot {
            Slot::Unloaded => LoadState::Unloaded,
            Slot::Loading => LoadState::Loading,
            Slot::Loaded(_) => LoadState::Loaded,
        };
        self.entries.iter().cloned().zip(slots.iter().map(state)).collect()
    }

    /// The loaded models, in order.
    pub fn loaded(&self) -> Vec<(String, Arc<T>)> {
        let slots = self.slots();
        let loaded = self.entries.iter().zip(slots.iter()).filter_map(|(entry, slot)| match slot {
            Slot::Loaded(l) => Some((entry.name.clone(), l.value.clone())),
            _ => None,
        });
        loaded.collect()
    }

    /// A lease on the model `name` (absent or empty: the first), loading it first when needed;
    /// `ttl` replaces its idle time-to-live (`Some(None)`: never unload).
    pub async fn acquire(
        self: &Arc<Self>,
        name: Option<&str>,
        ttl: Option<Option<Duration>>,
    ) -> Result<Lease<T>, RegistryError> {
        match self.begin(name, ttl)? {
            Acquisition::Ready(lease) => Ok(lease),
            Acquisition::Loading(load) => load.finish().await,
        }
    }

    /// [`acquire`](Self::acquire) up to the wait: a model not served or without room is refused
    /// now, a loaded one leased now, and an unloaded one starts loading (a load already under
    /// way is joined), so that the caller can answer its client meanwhile.
    pub fn begin(
        self: &Arc<Self>,
        name: Option<&str>,
        ttl: Option<Option<Duration>>,
    ) -> Result<Acquisition<T>, RegistryError> {
        let index = self.index_of(name)?;
        self.step(index, ttl)
    }

    /// One look at entry `index`: leased when loaded, waited on when loading, and loaded in a
    /// task of its own when unloaded and there is room.
    fn step(
        self: &Arc<Self>,
        index: usize,
        ttl: Option<Option<Duration>>,
    ) -> Result<Acquisition<T>, RegistryError> {
        // Subscribed before the state is read, so a load ending in between still wakes it.
        let loads_ended = self.loads_ended.subscribe();
        let mut slots = self.slots();
        let load = match &mut slots[index] {
            Slot::Loaded(loaded) => {
                loaded.in_flight += 1;
                loaded.last_used = self.clock.now();
                if let Some(ttl) = ttl.filter(|_| !loaded.pinned) {
                    loaded.ttl = ttl;
                }
                return Ok(Acquisition::Ready(self.lease(index, loaded.value.clone())));
            }
            Slot::Loading => None,
            Slot::Unloaded => {
                self.make_room(&mut slots, index)?;
                slots[index] = Slot::Loading;
                // A task of its own: a client that leaves while the model loads must not leave
                // it marked loading forever. The lease it makes is dropped with it if no one
                // waits.
                let registry = self.clone();
                let ttl = ttl.unwrap_or(self.default_ttl);
                Some(tokio::spawn(async move { registry.load(index, ttl).await }))
            }
        };
        let registry = self.clone();
        Ok(Acquisition::Loading(LoadWait { registry, index, ttl, load, loads_ended }))
    }

    /// Unloads every idle model whose time-to-live has passed; returns their names.
    pub fn unload_expired(&self) -> Vec<String> {
        let now = self.clock.now();
        let mut slots = self.slots();
        let mut unloaded = Vec::new();
        for (entry, slot) in self.entries.iter().zip(slots.iter_mut()) {
            let expired = matches!(slot, Slot::Loaded(l)
                if l.in_flight == 0 && l.ttl.is_some_and(|ttl| now.saturating_sub(l.last_used) >= ttl));
            if expired {
                tracing::info!(model = %entry.name, "unloading the model: idle past its time-to-live");
                self.discard(std::mem::replace(slot, Slot::Unloaded));
                unloaded.push(entry.name.clone());
            }
        }
        unloaded
    }

    fn index_of(&self, name: Option<&str>) -> Result<usize, RegistryError> {
        match name {
            None | Some("") => Ok(0),
            Some(name) => self.entries.iter().position(|e| e.name == name).ok_or_else(|| {
                RegistryError::NotFound {
                    name: name.to_string(),
                    served: self.entries.iter().map(|e| e.name.clone()).collect(),
                }
            }),
        }
    }

    /// Frees memory for entry `index` by unloading idle models, least recently used first;
    /// refuses, unloading none, when even all of them would not make room.
    fn make_room(&self, slots: &mut [Slot<T>], index: usize) -> Result<(), RegistryError> {
        let needed = self.entries[index].bytes;
        let held = |slot: &Slot<T>| !matches!(slot, Slot::Unloaded);
        let used: u64 = self
            .entries
            .iter()
            .zip(slots.iter())
            .filter(|(_, s)| held(s))
            .map(|(e, _)| e.bytes)
            .sum();
        let mut idle: Vec<(Duration, usize)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot {
                Slot::Loaded(l) if l.in_flight == 0 => Some((l.last_used, i)),
                _ => None,
            })
            .collect();
        idle.sort_unstable();
        let freeable: u64 = idle.iter().map(|&(_, i)| self.entries[i].bytes).sum();
        if used - freeable + needed > self.budget {
            let busy = (0..slots.len())
                .filter(|&i| held(&slots[i]) && !idle.iter().any(|&(_, j)| j == i))
                .map(|i| self.entries[i].name.clone())
                .collect();
            let free = self.budget.saturating_sub(used);
            let name = self.entries[index].name.clone();
            return Err(RegistryError::NoRoom { name, needed, free, budget: self.budget, busy });
        }
        let mut used = used;
        for (_, i) in idle {
            if used + needed <= self.budget {
                break;
            }
            tracing::info!(
                model = %self.entries[i].name,
                to_load = %self.entries[index].name,
                "unloading the least recently used idle model to make room"
            );
            self.discard(std::mem::replace(&mut slots[i], Slot::Unloaded));
            used -= self.entries[i].bytes;
        }
        Ok(())
    }

    /// Runs the loader for entry `index` (marked loading) off the async threads, and either
    /// leases the result or marks the entry unloaded again; waiters are woken either way.
    async fn load(
        self: &Arc<Self>,
        index: usize,
        ttl: Option<Duration>,
    ) -> Result<Lease<T>, RegistryError> {
        let entry = self.entries[index].clone();
        tracing::info!(model = %entry.name, source = %entry.source, bytes = entry.bytes, "loading the model");
        let loader = self.loader.clone();
        let started = self.clock.now();
        let mut loading = tokio::task::spawn_blocking(move || loader(&entry));
        let first_progress = tokio::time::Instant::now() + LOAD_PROGRESS_INTERVAL;
        let mut progress = tokio::time::interval_at(first_progress, LOAD_PROGRESS_INTERVAL);
        let loaded = loop {
            tokio::select! {
                loaded = &mut loading => {
                    break loaded.unwrap_or_else(|e| Err(format!("the load stopped: {e}")));
                }
                _ = progress.tick() => {
                    let name = &self.entries[index].name;
                    let seconds = (self.clock.now() - started).as_secs();
                    tracing::info!(model = %name, seconds, "still loading the model");
                }
            }
        };
        let result = match loaded {
            Ok(value) => {
                let now = self.clock.now();
                let value = Arc::new(value);
                let loaded = Loaded {
                    value: value.clone(),
                    in_flight: 1,
                    last_used: now,
                    ttl,
                    pinned: false,
                };
                self.slots()[index] = Slot::Loaded(loaded);
                let name = &self.entries[index].name;
                let seconds = (now - started).as_secs_f64();
                tracing::info!(model = %name, seconds, "model loaded");
                Ok(self.lease(index, value))
            }
            Err(reason) => Err(self.load_failed(index, reason)),
        };
        self.loads_ended.send_modify(|ended| *ended += 1);
        result
    }

    /// Marks entry `index` unloaded after its load failed.
    fn load_failed(&self, index: usize, reason: String) -> RegistryError {
        self.slots()[index] = Slot::Unloaded;
        let name = self.entries[index].name.clone();
        tracing::error!(model = %name, %reason, "the model failed to load");
        RegistryError::LoadFailed { name, reason }
    }

    fn lease(self: &Arc<Self>, index: usize, value: Arc<T>) -> Lease<T> {
        Lease { registry: self.clone(), index, value }
    }
}

impl<T> ModelRegistry<T> {
    fn slots(&self) -> MutexGuard<'_, Vec<Slot<T>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: Send + Sync + 'static> ModelRegistry<T> {
    /// Drops an unloaded model off the async threads where there are some (a model's engine
    /// joins its thread when it goes), then runs the unload hook.
    fn discard(&self, slot: Slot<T>) {
        let unloaded = self.unloaded.clone();
        let drop_it = move || {
            drop(slot);
            if let Some(unloaded) = unloaded {
                unloaded();
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(drop_it)),
            Err(_) => drop_it(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Time moved by the test alone.
    #[derive(Default)]
    struct ManualClock(Mutex<Duration>);

    impl ManualClock {
        fn advance(&self, by: Duration) {
            *self.0.lock().unwrap() += by;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Duration {
            *self.0.lock().unwrap()
        }
    }

    const MINUTE: Duration = Duration::from_secs(60);

    struct Fixture {
        registry: Arc<ModelRegistry<String>>,
        clock: Arc<ManualClock>,
        loads: Arc<AtomicUsize>,
    }

    /// Models `a`, `b`, `c` of 10 bytes each within `budget`; a load makes `loaded NAME`, and
    /// fails for a model whose source is `broken`.
    fn fixture(budget: u64) -> Fixture {
        let entries = ["a", "b", "c"]
            .map(|name| ModelEntry {
                name: name.into(),
                source: name.into(),
                bytes: 10,
                ..Default::default()
            })
            .to_vec();
        let loads = Arc::new(AtomicUsize::new(0));
        let counted = loads.clone();
        let loader: Loader<String> = Arc::new(move |entry: &ModelEntry| {
            counted.fetch_add(1, Ordering::SeqCst);
            match entry.source.as_str() {
                "broken" => Err("no such file".into()),
                _ => Ok(format!("loaded {}", entry.name)),
            }
        });
        let clock = Arc::new(ManualClock::default());
        let registry =
            ModelRegistry::new(entries, budget, Some(60 * MINUTE), loader, clock.clone());
        Fixture { registry, clock, loads }
    }

    fn states(registry: &ModelRegistry<String>) -> Vec<LoadState> {
        registry.list().into_iter().map(|(_, state)| state).collect()
    }

    use LoadState::{Loaded as L, Unloaded as U};

    #[tokio::test]
    async fn no_name_is_the_first_model_and_an_unknown_one_lists_the_served() {
        let f = fixture(100);
        assert_eq!(states(&f.registry), [U, U, U], "nothing loads before it is asked for");
        let lease = f.registry.acquire(None, None).await.unwrap();
        assert_eq!((lease.name(), lease.as_str()), ("a", "loaded a"));
        assert_eq!(f.registry.acquire(Some(""), None).await.unwrap().name(), "a");
        let error = f.registry.acquire(Some("z"), None).await.err().unwrap();
        let served = vec!["a".to_string(), "b".into(), "c".into()];
        assert_eq!(error, RegistryError::NotFound { name: "z".into(), served });
        assert_eq!(
            error.to_string(),
            "the model `z` does not exist; this server serves `a`, `b`, `c`"
        );
    }

    #[tokio::test]
    async fn concurrent_requests_for_an_unloaded_model_load_it_once() {
        let f = fixture(100);
        let (first, second) =
            tokio::join!(f.registry.acquire(Some("b"), None), f.registry.acquire(Some("b"), None));
        assert_eq!((first.unwrap().as_str(), second.unwrap().as_str()), ("loaded b", "loaded b"));
        assert_eq!(f.loads.load(Ordering::SeqCst), 1);
        assert_eq!(states(&f.registry), [U, L, U]);
    }

    #[tokio::test]
    async fn a_load_that_would_not_fit_unloads_the_least_recently_used_idle_model() {
        let f = fixture(25);
        drop(f.registry.acquire(Some("a"), None).await.unwrap());
        f.clock.advance(MINUTE);
        drop(f.registry.acquire(Some("b"), None).await.unwrap());
        f.clock.advance(MINUTE);
        // `a` used again: `b` is now the least recently used.
        drop(f.registry.acquire(Some("a"), None).await.unwrap());
        f.clock.advance(MINUTE);
        drop(f.registry.acquire(Some("c"), None).await.unwrap());
        assert_eq!(states(&f.registry), [L, U, L]);
        assert_eq!(f.loads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_model_with_requests_in_flight_is_never_unloaded() {
        let f = fixture(15);
        let in_flight = f.registry.acquire(Some("a"), None).await.unwrap();
        f.clock.advance(120 * MINUTE);
        let error = f.registry.acquire(Some("b"), None).await.err().unwrap();
        let busy = vec!["a".to_string()];
        assert_eq!(
            error,
            RegistryError::NoRoom { name: "b".into(), needed: 10, free: 5, budget: 15, busy }
        );
        assert!(f.registry.unload_expired().is_empty(), "in flight, so not idle");
        assert_eq!(states(&f.registry), [L, U, U]);
        drop(in_flight);
        assert_eq!(f.registry.acquire(Some("b"), None).await.unwrap().as_str(), "loaded b");
        assert_eq!(states(&f.registry), [U, L, U]);
    }

    #[tokio::test]
    async fn idle_models_unload_after_their_time_to_live() {
        let f = fixture(100);
        drop(f.registry.acquire(Some("a"), None).await.unwrap());
        // `b` asks for 10 seconds, `c` for never.
        drop(f.registry.acquire(Some("b"), Some(Some(Duration::from_secs(10)))).await.unwrap());
        drop(f.registry.acquire(Some("c"), Some(None)).await.unwrap());
        f.clock.advance(Duration::from_secs(10));
        assert_eq!(f.registry.unload_expired(), ["b"]);
        f.clock.advance(60 * MINUTE - Duration::from_secs(11));
        assert!(f.registry.unload_expired().is_empty(), "a minute short of the default");
        f.clock.advance(Duration::from_secs(1));
        assert_eq!(f.registry.unload_expired(), ["a"]);
        f.clock.advance(1000 * MINUTE);
        assert!(f.registry.unload_expired().is_empty());
        assert_eq!(states(&f.registry), [U, U, L]);
    }

    #[tokio::test]
    async fn a_model_loaded_at_start_stays_whatever_a_request_asks() {
        let f = fixture(100);
        f.registry.preload(0, "preloaded a".into());
        let lease = f.registry.acquire(Some("a"), Some(Some(Duration::ZERO))).await.unwrap();
        assert_eq!(lease.as_str(), "preloaded a");
        drop(lease);
        f.clock.advance(1000 * MINUTE);
        assert!(f.registry.unload_expired().is_empty());
        assert_eq!(f.loads.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_failed_load_is_reported_and_tried_again_on_the_next_request() {
        let entries = vec![ModelEntry {
            name: "x".into(),
            source: "broken".into(),
            bytes: 1,
            ..Default::default()
        }];
        let f = fixture(100);
        let registry =
            ModelRegistry::new(entries, 100, None, f.registry.loader.clone(), f.clock.clone());
        for _ in 0..2 {
            let error = registry.acquire(Some("x"), None).await.err().unwrap();
            let reason = "no such file".to_string();
            assert_eq!(error, RegistryError::LoadFailed { name: "x".into(), reason });
            assert_eq!(states(&registry), [U]);
        }
        assert_eq!(f.loads.load(Ordering::SeqCst), 2);
    }
}
