//! Prometheus metrics at `GET /metrics`: request counts, queue depth, token counters,
//! time-to-first-token / inter-token latency histograms, KV and snapshot memory, and vLLM's
//! names for the figures gateways read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use spindle_runner::EngineLoad;

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    pub prompt_tokens: Counter,
    pub generated_tokens: Counter,
    pub cached_prompt_tokens: Counter,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    /// Read speed of each request's new prompt positions.
    pub prefill_tokens_per_second: Histogram,
    orphan_prefill_tokens: Counter,
    orphan_tokens_reused: Counter,
    snapshot_bytes: Gauge,
    window_released_blocks: Gauge,
    queue_depth: Gauge,
    running: Gauge,
    vllm: VllmMetrics,
}

/// The same figures under vLLM's names, which dashboards and inference gateways already read.
#[derive(Default)]
struct VllmMetrics {
    waiting: Gauge,
    running: Gauge,
    kv_cache_usage: Gauge<f64, AtomicU64>,
    preemptions: Counter,
    prefix_cache_queries: Counter,
    prefix_cache_hits: Counter,
    spec_drafts: Counter,
    spec_draft_tokens: Counter,
    spec_accepted_tokens: Counter,
    /// Per draft position, how often it was accepted (position 0 is the first draft).
    spec_accepted_per_position: Family<Labels, Counter>,
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

    fn update(&self, load: &EngineLoad, prompt_tokens: u64, cached_tokens: u64) {
        let read = |gauge: &AtomicUsize| gauge.load(Ordering::Relaxed);
        self.waiting.set(read(&load.waiting) as i64);
        self.running.set(read(&load.active) as i64);
        let total = read(&load.kv_blocks_total).max(1);
        self.kv_cache_usage.set(read(&load.kv_blocks_used) as f64 / total as f64);
        catch_up(&self.preemptions, read(&load.preemptions) as u64);
        catch_up(&self.prefix_cache_queries, prompt_tokens);
        catch_up(&self.prefix_cache_hits, cached_tokens);
        catch_up(&self.spec_drafts, read(&load.spec_drafts) as u64);
        catch_up(&self.spec_draft_tokens, read(&load.spec_draft_tokens) as u64);
        catch_up(&self.spec_accepted_tokens, read(&load.spec_accepted_tokens) as u64);
        for (position, accepted) in load.spec_accepted_by_position.iter().enumerate() {
            let accepted = read(accepted) as u64;
            if accepted > 0 {
                let labels = vec![("position", position.to_string())];
                catch_up(&self.spec_accepted_per_position.get_or_create(&labels), accepted);
            }
        }
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
        let registry = root.sub_registry_with_prefix("spindle");
        let requests = Family::<Labels, Counter>::default();
        let prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        let cached_prompt_tokens = Counter::default();
        // 1 ms .. ~33 s, doubling: covers a cached decode step and a cold 8k-token prefill.
        let time_to_first_token = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let inter_token_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        // 4 .. ~130k tokens/s, doubling.
        let prefill_tokens_per_second = Histogram::new(exponential_buckets(4.0, 2.0, 16));
        let orphan_prefill_tokens = Counter::default();
        let orphan_tokens_reused = Counter::default();
        let snapshot_bytes = Gauge::default();
        let window_released_blocks = Gauge::default();
        let queue_depth = Gauge::default();
        let running = Gauge::default();
        registry.register("requests", "HTTP requests by endpoint and status", requests.clone());
        registry.register("prompt_tokens", "Prompt tokens processed", prompt_tokens.clone());
        registry.register("generated_tokens", "Tokens generated", generated_tokens.clone());
        registry.register(
            "cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            cached_prompt_tokens.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from request to first token",
            time_to_first_token.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive tokens",
            inter_token_latency.clone(),
        );
        registry.register(
            "prefill_tokens_per_second",
            "Prompt positions read per second, per request (cached ones not counted)",
            prefill_tokens_per_second.clone(),
        );
        registry.register(
            "orphan_prefill_tokens",
            "Prompt positions read after their client gave up, kept in the prefix cache for a retry",
            orphan_prefill_tokens.clone(),
        );
        registry.register(
            "orphan_prefill_reused_tokens",
            "Prompt positions read after their client gave up that later requests took from the prefix cache",
            orphan_tokens_reused.clone(),
        );
        registry.register(
            "prefix_cache_snapshot_bytes",
            "Memory of prefix-cache snapshots",
            snapshot_bytes.clone(),
        );
        registry.register(
            "kv_window_released_blocks",
            "KV blocks whose sliding-window layers' keys and values were given back to the OS",
            window_released_blocks.clone(),
        );
        registry.register("queue_depth", "Requests waiting for the engine", queue_depth.clone());
        registry.register("running_requests", "Sequences the engine is running", running.clone());
        Self {
            registry: root,
            vllm,
            requests,
            prompt_tokens,
            generated_tokens,
            cached_prompt_tokens,
            time_to_first_token,
            inter_token_latency,
            prefill_tokens_per_second,
            orphan_prefill_tokens,
            orphan_tokens_reused,
            snapshot_bytes,
            window_released_blocks,
            queue_depth,
            running,
        }
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

    /// The text exposition format, with the engine's gauges read now.
    pub fn render(&self, load: &EngineLoad) -> String {
        self.queue_depth.set(load.waiting.load(Ordering::Relaxed) as i64);
        self.running.set(load.active.load(Ordering::Relaxed) as i64);
        catch_up(
            &self.orphan_prefill_tokens,
            load.orphan_prefill_tokens.load(Ordering::Relaxed) as u64,
        );
        catch_up(
            &self.orphan_tokens_reused,
            load.orphan_tokens_reused.load(Ordering::Relaxed) as u64,
        );
        self.snapshot_bytes.set(load.snapshot_bytes.load(Ordering::Relaxed) as i64);
        let released = load.kv_window_released_blocks.load(Ordering::Relaxed);
        self.window_released_blocks.set(released as i64);
        self.vllm.update(load, self.prompt_tokens.get(), self.cached_prompt_tokens.get());
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}
