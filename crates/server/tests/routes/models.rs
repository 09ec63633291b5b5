//! Several models behind one server, each with its own scripted engine, loaded by the model
//! registry on its first request: which model answers, `/v1/models` and its load states, the
//! least recently used idle model unloaded for a load that would not fit, never one with a
//! request in flight (503 with `Retry-After` instead), the idle time-to-live (a clock the test
//! moves), and the 404 for a model not served.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use serde_json::{json, Value};
use spindle_server::{
    AppState, Clock, LoadedModel, Loader, ModelEntry, ModelRegistry, ServedModel, ServerConfig,
};
use tower::ServiceExt;

use crate::common::{
    body_text, config, next_chunk, parse_chat_stream, post_json, qwen3_template, sse_data,
    tokenizer, Gate, Reply, ScriptedEngine,
};

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

/// A server of models `a`, `b` and `c` (10 bytes each) within `budget` bytes, idle ones
/// unloaded after an hour. Each answers `I am NAME.`; `a` holds its answers on `gate`, and a
/// load of `c` waits for `c_load` to open.
struct Models {
    state: Arc<AppState>,
    clock: Arc<ManualClock>,
    loads: Arc<AtomicUsize>,
    gate: Gate,
    c_load: Gate,
    engines: Engines,
}

/// Each engine loaded so far, by model name: gone once its model is unloaded.
type Engines = Arc<Mutex<Vec<(String, Weak<ScriptedEngine>)>>>;

fn models(budget: u64) -> Models {
    models_with(budget, config())
}

fn models_with(budget: u64, config: ServerConfig) -> Models {
    built(budget, config, false)
}

/// Models `a`, `b`, `c` within `budget`; `c`'s load waits for `c_load` to open and then
/// succeeds, or fails where `c_fails`.
fn built(budget: u64, config: ServerConfig, c_fails: bool) -> Models {
    let entries = ["a", "b", "c"]
        .map(|name| ModelEntry {
            name: name.into(),
            source: name.into(),
            bytes: 10,
            ..Default::default()
        })
        .to_vec();
    let (loads, gate, c_load) = (Arc::new(AtomicUsize::new(0)), Gate::default(), Gate::default());
    let engines: Engines = Arc::default();
    let (counted, held, c_held, made) =
        (loads.clone(), gate.clone(), c_load.clone(), engines.clone());
    let loader: Loader<LoadedModel> = Arc::new(move |entry: &ModelEntry| {
        counted.fetch_add(1, Ordering::SeqCst);
        if entry.name == "c" {
            c_held.wait(|| false);
            if c_fails {
                return Err("c's weights are damaged".to_string());
            }
        }
        let (text, gate) = (format!("I am {}.", entry.name), held.clone());
        let holds = entry.name == "a";
        let engine = Arc::new(ScriptedEngine::new(tokenizer(), move |_| match holds {
            true => Reply::Held { text: text.clone(), gate: gate.clone() },
            false => Reply::text(text.clone()),
        }));
        made.lock().unwrap().push((entry.name.clone(), Arc::downgrade(&engine)));
        let model = ServedModel {
            tokenizer: tokenizer(),
            template: qwen3_template(),
            max_positions: 32_768,
            kv_tokens: 1 << 16,
            sampling: Default::default(),
        };
        LoadedModel::new(entry.name.clone(), 2048, model, engine, None).map_err(|e| e.to_string())
    });
    let clock = Arc::new(ManualClock::default());
    let hour = Some(Duration::from_secs(3600));
    let registry = ModelRegistry::new(entries, budget, hour, loader, clock.clone());
    let state = spindle_server::start_with_registry(config, registry);
    Models { state, clock, loads, gate, c_load, engines }
}

impl Models {
    async fn send(&self, request: Request<Body>) -> Response {
        spindle_server::router(self.state.clone()).oneshot(request).await.unwrap()
    }

    /// Status and JSON body of a chat request to `model` (`None`: naming none).
    async fn chat(&self, model: Option<&str>) -> (u16, Value) {
        let response = self.send(post_json("/v1/chat/completions", &chat(model, false))).await;
        let status = response.status().as_u16();
        (status, serde_json::from_str(&body_text(response).await).unwrap())
    }

    /// The answer's text of a chat request to `model`, checking it succeeded.
    async fn answer(&self, model: Option<&str>) -> String {
        let (status, body) = self.chat(model).await;
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    }

    /// Each served model's id and `status` in `/v1/models`.
    async fn statuses(&self) -> Vec<(String, String)> {
        let response = self.send(Request::get("/v1/models").body(Body::empty()).unwrap()).await;
        let list: Value = serde_json::from_str(&body_text(response).await).unwrap();
        let cards = list["data"].as_array().unwrap().iter();
        cards
            .map(|m| (m["id"].as_str().unwrap().into(), m["status"].as_str().unwrap().into()))
            .collect()
    }

    /// Returns once model `name` is listed as loading (its loader has been called).
    async fn wait_until_loading(&self, name: &str) {
        let loading = (name.to_string(), "loading".to_string());
        while !self.statuses().await.contains(&loading) {
            tokio::task::yield_now().await;
        }
    }

    /// Returns once every engine loaded for model `name` has been dropped.
    async fn wait_until_engines_dropped(&self, name: &str) {
        let alive = || {
            let engines = self.engines.lock().unwrap();
            engines.iter().any(|(model, engine)| model == name && engine.strong_count() > 0)
        };
        // An unloaded model is dropped off the async threads, a moment later.
        while alive() {
            tokio::task::yield_now().await;
        }
    }
}

fn chat(model: Option<&str>, stream: bool) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Who are you?"}],
        "max_tokens": 16, "stream": stream});
    if let Some(model) = model {
        body["model"] = model.into();
    }
    body
}

fn listed(states: &[(&str, &str)]) -> Vec<(String, String)> {
    states.iter().map(|&(id, state)| (id.to_string(), state.to_string())).collect()
}

#[tokio::test]
async fn each_model_answers_itself_and_a_request_naming_none_gets_the_first() {
    let server = models(100);
    server.gate.open();
    assert_eq!(
        server.statuses().await,
        listed(&[("a", "not-loaded"), ("b", "not-loaded"), ("c", "not-loaded")])
    );
    assert_eq!(server.answer(Some("b")).await, "I am b.");
    assert_eq!(server.answer(None).await, "I am a.");
    assert_eq!(server.answer(Some("b")).await, "I am b.");
    let (_, body) = server.chat(Some("b")).await;
    assert_eq!(body["model"], "b", "the response names the model that answered");
    assert_eq!(server.loads.load(Ordering::SeqCst), 2, "each model loaded once");
    assert_eq!(
        server.statuses().await,
        listed(&[("a", "loaded"), ("b", "loaded"), ("c", "not-loaded")])
    );
}

#[tokio::test]
async fn metrics_label_each_loaded_model_s_series_with_its_name() {
    let server = models(100);
    server.gate.open();
    server.answer(Some("a")).await;
    server.answer(Some("b")).await;
    server.answer(Some("b")).await;
    let response = server.send(Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let text = body_text(response).await;
    let value = |series: &str| -> f64 {
        let line = text.lines().find_map(|l| l.strip_prefix(series));
        line.unwrap_or_else(|| panic!("no {series} in\n{text}")).trim().parse().unwrap()
    };
    let requests = |model: &str| {
        value(&format!("spindle_time_to_first_token_seconds_count{{model_name=\"{model}\"}}"))
    };
    assert_eq!((requests("a"), requests("b")), (1.0, 2.0));
    for series in ["vllm:num_requests_running", "vllm:kv_cache_usage_perc"] {
        for model in ["a", "b"] {
            value(&format!("{series}{{model_name=\"{model}\"}}"));
        }
    }
    assert!(!text.contains("model_name=\"c\""), "c is not loaded:\n{text}");
}

#[tokio::test]
async fn a_model_not_served_is_a_404_naming_those_that_are() {
    let server = models(100);
    let (status, body) = server.chat(Some("z")).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`a`, `b`, `c`"), "{message}");
    assert_eq!(server.loads.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_load_that_would_not_fit_unloads_the_least_recently_used_idle_model() {
    let server = models(25);
    server.gate.open();
    server.c_load.open();
    // `a`, `b`, then `a` again, a second apart: `b` is the least recently used.
    for model in ["a", "b", "a"] {
        server.answer(Some(model)).await;
        server.clock.advance(Duration::from_secs(1));
    }
    server.answer(Some("c")).await;
    assert_eq!(
        server.statuses().await,
        listed(&[("a", "loaded"), ("b", "not-loaded"), ("c", "loaded")])
    );
}

#[tokio::test]
async fn a_model_answering_a_request_is_never_unloaded_and_the_other_waits_with_503() {
    let server = models(15);
    // `a` holds its answer: the stream is in flight until the gate opens.
    let response = server.send(post_json("/v1/chat/completions", &chat(Some("a"), true))).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body().into_data_stream();
    next_chunk(&mut stream).await.expect("the role chunk");
    let refused = server.send(post_json("/v1/chat/completions", &chat(Some("b"), false))).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "5");
    let body: Value = serde_json::from_str(&body_text(refused).await).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("loading `b`") && message.contains("(`a`)"), "{message}");
    server.gate.open();
    while next_chunk(&mut stream).await.is_some() {}
    drop(stream);
    assert_eq!(server.answer(Some("b")).await, "I am b.");
    assert_eq!(
        server.statuses().await,
        listed(&[("a", "not-loaded"), ("b", "loaded"), ("c", "not-loaded")])
    );
}

#[tokio::test]
async fn an_idle_model_unloads_after_its_time_to_live_and_loads_again_when_asked() {
    let server = models(100);
    server.gate.open();
    server.answer(Some("b")).await;
    server.clock.advance(Duration::from_secs(3599));
    assert!(server.state.models.unload_expired().is_empty());
    server.clock.advance(Duration::from_secs(1));
    assert_eq!(server.state.models.unload_expired(), ["b"]);
    assert_eq!(server.statuses().await[1], ("b".to_string(), "not-loaded".to_string()));
    server.wait_until_engines_dropped("b").await;
    assert_eq!(server.answer(Some("b")).await, "I am b.");
    assert_eq!(server.loads.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_request_s_ttl_sets_how_long_its_model_may_idle() {
    let server = models(100);
    server.gate.open();
    server.c_load.open();
    let mut body = chat(Some("b"), false);
    body["ttl"] = json!(10);
    assert_eq!(server.send(post_json("/v1/chat/completions", &body)).await.status(), 200);
    body["model"] = json!("c");
    body["ttl"] = json!(0);
    assert_eq!(server.send(post_json("/v1/chat/completions", &body)).await.status(), 200);
    server.clock.advance(Duration::from_secs(10));
    assert_eq!(server.state.models.unload_expired(), ["b"]);
    server.clock.advance(Duration::from_secs(100 * 3600));
    assert!(server.state.models.unload_expired().is_empty(), "0: never");
}

#[tokio::test]
async fn three_models_answer_requests_interleaved_and_at_once() {
    let server = models(100);
    server.gate.open();
    server.c_load.open();
    let (a, b, c, b2, a2, c2) = tokio::join!(
        server.answer(Some("a")),
        server.answer(Some("b")),
        server.answer(Some("c")),
        server.answer(Some("b")),
        server.answer(Some("a")),
        server.answer(Some("c")),
    );
    assert_eq!(
        [a, b, c, b2, a2, c2],
        ["I am a.", "I am b.", "I am c.", "I am b.", "I am a.", "I am c."]
    );
    assert_eq!(server.loads.load(Ordering::SeqCst), 3, "each model loaded once");
    assert_eq!(
        server.statuses().await,
        listed(&[("a", "loaded"), ("b", "loaded"), ("c", "loaded")])
    );
}

#[tokio::test]
async fn a_model_loading_leaves_another_answering() {
    let server = models(100);
    server.answer(Some("b")).await;
    let state = server.state.clone();
    let for_c = tokio::spawn(async move {
        let request = post_json("/v1/chat/completions", &chat(Some("c"), false));
        let response = spindle_server::router(state).oneshot(request).await.unwrap();
        body_text(response).await
    });
    server.wait_until_loading("c").await;
    for _ in 0..3 {
        assert_eq!(server.answer(Some("b")).await, "I am b.");
    }
    assert_eq!(server.statuses().await[2], ("c".to_string(), "loading".to_string()));
    server.c_load.open();
    let body: Value = serde_json::from_str(&for_c.await.unwrap()).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "I am c.");
}

/// A quiet time of a millisecond: keep-alives come as often as the stream is read.
fn quick_keep_alives() -> ServerConfig {
    ServerConfig { keep_alive: Duration::from_millis(1), ..config() }
}

#[tokio::test]
async fn a_stream_whose_model_loads_gets_keep_alives_until_the_answer() {
    let server = models_with(100, quick_keep_alives());
    let response = server.send(post_json("/v1/chat/completions", &chat(Some("c"), true))).await;
    assert_eq!(response.status(), 200, "answered before the load ends");
    let mut stream = response.into_body().into_data_stream();
    for _ in 0..2 {
        assert_eq!(next_chunk(&mut stream).await.unwrap(), ": keep-alive\n\n");
    }
    assert_eq!(server.statuses().await[2], ("c".to_string(), "loading".to_string()));
    server.c_load.open();
    let mut rest = String::new();
    while let Some(chunk) = next_chunk(&mut stream).await {
        rest.push_str(&chunk);
    }
    let data = sse_data(&rest);
    assert_eq!(parse_chat_stream(&data).content, "I am c.");
}

#[tokio::test]
async fn a_messages_stream_whose_model_loads_gets_pings_until_the_answer() {
    let server = models_with(100, quick_keep_alives());
    let body = json!({"model": "c", "max_tokens": 16, "stream": true,
        "messages": [{"role": "user", "content": "Who are you?"}]});
    let response = server.send(post_json("/v1/messages", &body)).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body().into_data_stream();
    let first = next_chunk(&mut stream).await.unwrap();
    assert!(first.starts_with("event: ping\n"), "{first}");
    server.c_load.open();
    let mut rest = String::new();
    while let Some(chunk) = next_chunk(&mut stream).await {
        rest.push_str(&chunk);
    }
    let events: Vec<Value> =
        sse_data(&rest).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let text: String = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
    assert_eq!(text, "I am c.");
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let opened = kinds.iter().position(|&k| k == "message_start").expect("message_start");
    assert!(kinds[..opened].iter().all(|&k| k == "ping"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"message_stop"));
}

#[tokio::test]
async fn a_stream_whose_model_fails_to_load_ends_with_the_error_event() {
    let server = built(100, quick_keep_alives(), true);
    let response = server.send(post_json("/v1/chat/completions", &chat(Some("c"), true))).await;
    assert_eq!(response.status(), 200, "answered before the load ends");
    let mut stream = response.into_body().into_data_stream();
    assert_eq!(next_chunk(&mut stream).await.unwrap(), ": keep-alive\n\n");
    server.c_load.open();
    let mut rest = String::new();
    while let Some(chunk) = next_chunk(&mut stream).await {
        rest.push_str(&chunk);
    }
    let data = sse_data(&rest);
    let error: Value = serde_json::from_str(&data[0]).unwrap_or_else(|e| panic!("{e}: {rest}"));
    let message = error["error"]["message"].as_str().unwrap_or_else(|| panic!("{rest}"));
    assert!(message.contains("c's weights are damaged"), "{message}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{rest}");
    // The failed load leaves the model unloaded, and the others answer.
    assert_eq!(server.statuses().await[2], ("c".to_string(), "not-loaded".to_string()));
    assert_eq!(server.answer(Some("b")).await, "I am b.");
}

#[tokio::test]
async fn a_messages_stream_whose_model_fails_to_load_ends_with_an_error_event() {
    let server = built(100, quick_keep_alives(), true);
    let body = json!({"model": "c", "max_tokens": 16, "stream": true,
        "messages": [{"role": "user", "content": "Who are you?"}]});
    let response = server.send(post_json("/v1/messages", &body)).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body().into_data_stream();
    assert!(next_chunk(&mut stream).await.unwrap().starts_with("event: ping\n"));
    server.c_load.open();
    let mut rest = String::new();
    while let Some(chunk) = next_chunk(&mut stream).await {
        rest.push_str(&chunk);
    }
    assert!(rest.contains("event: error\n"), "{rest}");
    let events: Vec<Value> =
        sse_data(&rest).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let error = events.iter().find(|e| e["type"] == "error").unwrap_or_else(|| panic!("{rest}"));
    assert!(error["error"]["message"].as_str().unwrap().contains("c's weights are damaged"));
}

#[tokio::test]
async fn a_whole_response_whose_model_loads_waits_for_it() {
    let server = models(100);
    let state = server.state.clone();
    let for_c = tokio::spawn(async move {
        let request = post_json("/v1/chat/completions", &chat(Some("c"), false));
        spindle_server::router(state).oneshot(request).await.unwrap()
    });
    server.wait_until_loading("c").await;
    server.c_load.open();
    let response = for_c.await.unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = serde_json::from_str(&body_text(response).await).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "I am c.");
}
