//! Prometheus metrics at `GET /metrics`: request counts, queue depth, token counters,
//! time-to-first-token / inter-token latency histograms, KV and snapshot memory, and vLLM's
//! names for the figures gateways read. Every series of one model is labelled with its
//! `model_name`, as vLLM labels them; request counts by endpoint and status are the server's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use spindle_runner::EngineLoad;

type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

fn model_labels(model: &str) -> Labels {
    vec![("model_name", model.to_string())]
}

/// 1 ms .. ~33 s, doubling: covers a cached decode step and a cold 8k-token prefill.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// 4 .. ~130k tokens/s, doubling.
fn speed_histogram() -> Histogram {
    Histogram::new(exponential_buckets(4.0, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    requests: Counters,
    spindle: SpindleMetrics,
    vllm: VllmMetrics,
    /// The engine totals last read, per model and counter, with the engine they were read from:
    /// a reloaded model's engine counts from zero again, and its counters go on from theirs.
    engine_totals: Mutex<HashMap<(String, String), (usize, u64)>>,
}

/// Spindle's own per-model series.
struct SpindleMetrics {
    prompt_tokens: Counters,
    generated_tokens: Counters,
    cached_prompt_tokens: Counters,
    time_to_first_token: Histograms,
    inter_token_latency: Histograms,
    /// Read speed of each request's new prompt positions.
    prefill_tokens_per_second: Histograms,
    orphan_prefill_tokens: Counters,
    orphan_tokens_reused: Counters,
    snapshot_bytes: Gauges,
    window_released_blocks: Gauges,
    queue_depth: Gauges,
    running: Gauges,
}

impl SpindleMetrics {
    fn new() -> Self {
        Self {
            prompt_tokens: Counters::default(),
            generated_tokens: Counters::default(),
            cached_prompt_tokens: Counters::default(),
            time_to_first_token: Histograms::new_with_constructor(latency_histogram),
            inter_token_latency: Histograms::new_with_constructor(latency_histogram),
            prefill_tokens_per_second: Histograms::new_with_constructor(speed_histogram),
            orphan_prefill_tokens: Counters::default(),
            orphan_tokens_reused: Counters::default(),
            snapshot_bytes: Gauges::default(),
            window_released_blocks: Gauges::default(),
            queue_depth: Gauges::default(),
            running: Gauges::default(),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register("prompt_tokens", "Prompt tokens processed", self.prompt_tokens.clone());
        registry.register("generated_tokens", "Tokens generated", self.generated_tokens.clone());
        registry.register(
            "cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            self.cached_prompt_tokens.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from request to first token",
            self.time_to_first_token.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive tokens",
            self.inter_token_latency.clone(),
        );
        registry.register(
            "prefill_tokens_per_second",
            "Prompt positions read per second, per request (cached ones not counted)",
            self.prefill_tokens_per_second.clone(),
        );
        registry.register(
            "orphan_prefill_tokens",
            "Prompt positions read after their client gave up, kept in the prefix cache for a retry",
            self.orphan_prefill_tokens.clone(),
        );
        registry.register(
            "orphan_prefill_reused_tokens",
            "Prompt positions read after their client gave up that later requests took from the prefix cache",
            self.orphan_tokens_reused.clone(),
        );
        registry.register(
            "prefix_cache_snapshot_bytes",
            "Memory of prefix-cache snapshots",
            self.snapshot_bytes.clone(),
        );
        registry.register(
            "kv_window_released_blocks",
            "KV blocks whose sliding-window layers' keys and values were given back to the OS",
            self.window_released_blocks.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for the engine",
            self.queue_depth.clone(),
        );
        registry.register(
            "running_requests",
            "Sequences the engine is running",
            self.running.clone(),
        );
    }
}

/// The same figures under vLLM's names, which dashboards and inference gateways already read.
#[derive(Default)]
struct VllmMetrics {
    waiting: Gauges,
    running: Gauges,
    kv_cache_usage: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Always 1, labelled with the KV pool's shape: llm-d's endpoint picker reads the labels.
    cache_config_info: Gauges,
    preemptions: Counters,
    prefix_cache_queries: Counters,
    prefix_cache_hits: Counters,
    spec_drafts: Counters,
    spec_draft_tokens: Counters,
    spec_accepted_tokens: Counters,
    /// Per draft position, how often it was accepted (position 0 is the first draft).
    spec_accepted_per_position: Counters,
}

impl VllmMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "vllm:num_requests_waiting",
            "Requests waiting to be admitted",
            self.waiting.clone(),
        );
        registry.register("vllm:num_requests_running", "Requests running", self.running.clone());
        registry.register(
            "vllm:kv_cache_usage_perc",
            "Share of KV blocks running requests hold (1 = full)",
            self.kv_cache_usage.clone(),
        );
        registry.register(
            "vllm:cache_config_info",
            "The KV pool's shape: positions per block and blocks in the pool",
            self.cache_config_info.clone(),
        );
        registry.register(
            "vllm:num_preemptions",
            "Sequences preempted because the KV pool ran out",
            self.preemptions.clone(),
        );
        registry.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            self.prefix_cache_queries.clone(),
        );
        registry.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            self.prefix_cache_hits.clone(),
        );
        registry.register(
            "vllm:spec_decode_num_drafts",
            "Speculative rounds that drafted tokens",
            self.spec_drafts.clone(),
        );
        registry.register(
            "vllm:spec_decode_num_draft_tokens",
            "Tokens drafted for speculative rounds",
            self.spec_draft_tokens.clone(),
        );
        registry.register(
            "vllm:spec_decode_num_accepted_tokens",
            "Drafted tokens the model picked itself",
            self.spec_accepted_tokens.clone(),
        );
        registry.register(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Drafted tokens accepted, by their position in the round",
            self.spec_accepted_per_position.clone(),
        );
    }
}

/// Raises `counter` to `value`, a total kept elsewhere.
fn catch_up(counter: &Counter, value: u64) {
    counter.inc_by(value.saturating_sub(counter.get()));
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let vllm = VllmMetrics::default();
        vllm.register(&mut root);
        let spindle = SpindleMetrics::new();
        let registry = root.sub_registry_with_prefix("spindle");
        let requests = Counters::default();
        registry.register("requests", "HTTP requests by endpoint and status", requests.clone());
        spindle.register(registry);
        Self { registry: root, requests, spindle, vllm, engine_totals: Mutex::default() }
    }
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&vec![
                ("endpoint", endpoint.to_string()),
                ("status", status.to_string()),
            ])
            .inc();
    }

    /// A request to `model` got its first token `seconds` after it came in.
    pub fn first_token(&self, model: &str, seconds: f64) {
        self.spindle.time_to_first_token.get_or_create(&model_labels(model)).observe(seconds);
    }

    /// A token of `model` came `seconds` after the one before.
    pub fn inter_token(&self, model: &str, seconds: f64) {
        self.spindle.inter_token_latency.get_or_create(&model_labels(model)).observe(seconds);
    }

    /// A request to `model` read its new prompt positions at this speed.
    pub fn prefill_speed(&self, model: &str, tokens_per_second: f64) {
        let labels = model_labels(model);
        self.spindle.prefill_tokens_per_second.get_or_create(&labels).observe(tokens_per_second);
    }

    /// A request to `model` finished with these token counts.
    pub fn finished(&self, model: &str, prompt: usize, generated: usize, cached: usize) {
        let labels = model_labels(model);
        self.spindle.prompt_tokens.get_or_create(&labels).inc_by(prompt as u64);
        self.spindle.generated_tokens.get_or_create(&labels).inc_by(generated as u64);
        self.spindle.cached_prompt_tokens.get_or_create(&labels).inc_by(cached as u64);
    }

    /// The text exposition format, with each loaded model's engine gauges read now; every
    /// model's KV blocks hold `block_size` positions.
    pub fn render(&self, engines: &[(String, &EngineLoad)], block_size: usize) -> String {
        // A model unloaded, or reloaded with another pool, must not leave its old shape behind.
        self.vllm.cache_config_info.clear();
        for (model, load) in engines {
            self.read_engine(model, load, block_size);
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    fn read_engine(&self, model: &str, load: &EngineLoad, block_size: usize) {
        let labels = model_labels(model);
        let read = |gauge: &AtomicUsize| gauge.load(Ordering::Relaxed);
        let set = |family: &Gauges, value: usize| family.get_or_create(&labels).set(value as i64);
        let (spindle, vllm) = (&self.spindle, &self.vllm);
        set(&spindle.queue_depth, read(&load.waiting));
        set(&spindle.running, read(&load.active));
        set(&spindle.snapshot_bytes, read(&load.snapshot_bytes));
        set(&spindle.window_released_blocks, read(&load.kv_window_released_blocks));
        set(&vllm.waiting, read(&load.waiting));
        set(&vllm.running, read(&load.active));
        let total = read(&load.kv_blocks_total).max(1);
        let usage = read(&load.kv_blocks_used) as f64 / total as f64;
        vllm.kv_cache_usage.get_or_create(&labels).set(usage);
        let mut shape = labels.clone();
        shape.push(("block_size", block_size.to_string()));
        shape.push(("num_gpu_blocks", read(&load.kv_blocks_total).to_string()));
        vllm.cache_config_info.get_or_create(&shape).set(1);
        let prompt_tokens = spindle.prompt_tokens.get_or_create(&labels).get();
        catch_up(&vllm.prefix_cache_queries.get_or_create(&labels), prompt_tokens);
        let cached_tokens = spindle.cached_prompt_tokens.get_or_create(&labels).get();
        catch_up(&vllm.prefix_cache_hits.get_or_create(&labels), cached_tokens);
        let engine = load as *const EngineLoad as usize;
        let advance = |family: &Counters, labels: &Labels, key: String, total: &AtomicUsize| {
            self.advance(
                &family.get_or_create(labels),
                (model.to_string(), key),
                engine,
                read(total),
            );
        };
        advance(
            &spindle.orphan_prefill_tokens,
            &labels,
            "orphan".into(),
            &load.orphan_prefill_tokens,
        );
        advance(
            &spindle.orphan_tokens_reused,
            &labels,
            "reused".into(),
            &load.orphan_tokens_reused,
        );
        advance(&vllm.preemptions, &labels, "preemptions".into(), &load.preemptions);
        advance(&vllm.spec_drafts, &labels, "drafts".into(), &load.spec_drafts);
        advance(&vllm.spec_draft_tokens, &labels, "draft_tokens".into(), &load.spec_draft_tokens);
        advance(&vllm.spec_accepted_tokens, &labels, "accepted".into(), &load.spec_accepted_tokens);
        for (position, accepted) in load.spec_accepted_by_position.iter().enumerate() {
            if read(accepted) > 0 {
                let mut by_position = labels.clone();
                by_position.push(("position", position.to_string()));
                let key = format!("accepted@{position}");
                advance(&vllm.spec_accepted_per_position, &by_position, key, accepted);
            }
        }
    }

    /// Adds to `counter` what engine `engine`'s total for `key` gained since last read (all of
    /// it when the model's engine is a new one).
    fn advance(&self, counter: &Counter, key: (String, String), engine: usize, total: usize) {
        let mut totals = self.engine_totals.lock().unwrap_or_else(|e| e.into_inner());
        let previous = match totals.insert(key, (engine, total as u64)) {
            Some((same, last)) if same == engine => last,
            _ => 0,
        };
        counter.inc_by((total as u64).saturating_sub(previous));
    }
}
