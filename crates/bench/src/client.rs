//! A small client for any OpenAI-compatible server: streamed chat calls that are timed, plus
//! the optional endpoints the benchmark uses when the server has them (`/health`,
//! `/v1/models`, vLLM-style `/v1/tokenize` or llama-server's `/tokenize`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use spindle_api::TokenizeResponse;

use crate::error::BenchError;
use crate::sse::{CallTracker, Measurement, SseDecoder};

/// Longest a single call may take: a burst of 64 against a CPU server that recomputes every
/// prompt can need many minutes for its last call.
const CALL_TIMEOUT: Duration = Duration::from_secs(3600);
/// Longest a readiness or metadata probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One server; cheap to clone (the connection pool is shared).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    model: Option<String>,
    api_key: Option<String>,
    /// Sent as `X-Session-ID` on every request, so that a router in front of several replicas
    /// (vllm-router's `consistent_hash`) keeps this client's conversation on the replica that
    /// holds its cache.
    session: String,
}

/// The header routers key sticky sessions on.
pub const SESSION_HEADER: &str = "X-Session-ID";

impl Client {
    /// A client for the server at `base_url` (e.g. `http://127.0.0.1:8080`, with or without a
    /// trailing `/` or `/v1`).
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, BenchError> {
        let base = base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base).to_string();
        // A fresh connection per call: some servers (llama-server) close idle keep-alive
        // connections, and a pooled one that closed fails the next call.
        let http =
            reqwest::Client::builder().timeout(CALL_TIMEOUT).pool_max_idle_per_host(0).build()?;
        Ok(Self { http, base, model: None, api_key, session: new_session_id() })
    }

    /// The `X-Session-ID` this client sends.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Sends `session` as `X-Session-ID` from now on (each simulated agent its own).
    pub fn set_session(&mut self, session: &str) {
        self.session = session.to_string();
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The model named in requests; `None` leaves the field out.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_with_key(method, path, self.api_key.as_deref())
    }

    /// A request that sends `key` (or none) instead of the client's own API key.
    pub(crate) fn request_with_key(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let builder = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header(SESSION_HEADER, &self.session);
        match key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// The API key requests carry.
    pub(crate) fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// Whether the server answers now: `GET /health` with a success status, or, for servers
    /// without that endpoint (Ollama, LM Studio), `GET /v1/models`.
    pub async fn is_ready(&self) -> bool {
        let probe = |path| self.request(reqwest::Method::GET, path).timeout(PROBE_TIMEOUT).send();
        if probe("/health").await.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
        probe("/v1/models").await.is_ok_and(|r| r.status().is_success())
    }

    /// Polls [`Client::is_ready`] until it holds or `timeout` passes.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), BenchError> {
        let start = Instant::now();
        while !self.is_ready().await {
            if start.elapsed() > timeout {
                return Err(BenchError::NotReady(timeout));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Names `model` in later requests.
    pub fn set_model(&mut self, model: &str) {
        self.model = Some(model.to_string());
    }

    /// Names the first model of `GET /v1/models` in later requests (servers such as vLLM
    /// refuse a request for another name). Leaves the model unset when the listing fails.
    pub async fn discover_model(&mut self) {
        let listing = self.get_json("/v1/models").await;
        self.model = listing.and_then(|v| v["data"][0]["id"].as_str().map(str::to_string));
    }

    /// The Prometheus text at `GET /metrics`, if the server exports one.
    pub async fn metrics(&self) -> Option<String> {
        let response = self
            .request(reqwest::Method::GET, "/metrics")
            .timeout(PROBE_TIMEOUT)
            .send()
            .await
            .ok()?;
        response.error_for_status().ok()?.text().await.ok()
    }

    async fn get_json(&self, path: &str) -> Option<Value> {
        let response =
            self.request(reqwest::Method::GET, path).timeout(PROBE_TIMEOUT).send().await.ok()?;
        response.error_for_status().ok()?.json().await.ok()
    }

    /// `body` with `"model"` set when a model is known (some servers reject `null`).
    pub(crate) fn with_model(&self, mut body: Value) -> Value {
        if let (Some(model), Some(map)) = (&self.model, body.as_object_mut()) {
            map.insert("model".into(), Value::from(model.as_str()));
        }
        body
    }

    async fn tokenize(&self, body: Value) -> Option<Vec<u32>> {
        let body = self.with_model(body);
        let response =
            self.request(reqwest::Method::POST, "/v1/tokenize").json(&body).send().await.ok()?;
        let answer: TokenizeResponse = response.error_for_status().ok()?.json().await.ok()?;
        Some(answer.tokens)
    }

    /// Tokens in `text` alone, if the server has `/v1/tokenize` or llama-server's `/tokenize`.
    pub async fn count_tokens(&self, text: &str) -> Option<usize> {
        if let Some(tokens) =
            self.tokenize(json!({"prompt": text, "add_special_tokens": false})).await
        {
            return Some(tokens.len());
        }
        let body = json!({"content": text, "add_special": false});
        let response =
            self.request(reqwest::Method::POST, "/tokenize").json(&body).send().await.ok()?;
        let answer: Value = response.error_for_status().ok()?.json().await.ok()?;
        answer["tokens"].as_array().map(Vec::len)
    }

    /// Tokens that two chat prompts with the same system message and the user messages `a` and
    /// `b` have in common from the start, if the server has `/v1/tokenize` for messages: the
    /// most any prefix cache could serve to a call with a new user message.
    pub async fn shared_prefix_tokens(&self, system: &str, a: &str, b: &str) -> Option<usize> {
        let body = |user: &str| json!({"messages": messages(system, user)});
        let (x, y) = (self.tokenize(body(a)).await?, self.tokenize(body(b)).await?);
        Some(x.iter().zip(&y).take_while(|(p, q)| p == q).count())
    }

    /// One non-streamed chat call with the request `body` as given (the model added): the
    /// response's JSON.
    pub async fn chat_completion(&self, body: Value) -> Result<Value, BenchError> {
        let body = self.with_model(body);
        let response =
            self.request(reqwest::Method::POST, "/v1/chat/completions").json(&body).send().await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(BenchError::Status { status: status.as_u16(), body });
        }
        Ok(response.json().await?)
    }

    /// One streamed chat call (greedy, `max_tokens` at most), timed from sending the request.
    pub async fn chat(
        &self,
        system: &str,
        user: &str,
        max_tokens: u32,
    ) -> Result<Measurement, BenchError> {
        let messages = messages(system, user);
        self.chat_messages(&messages, max_tokens).await.map(|(measurement, _)| measurement)
    }

    /// [`Self::chat`] with the whole `messages` list given; also returns the answer text.
    pub async fn chat_messages(
        &self,
        messages: &Value,
        max_tokens: u32,
    ) -> Result<(Measurement, String), BenchError> {
        let body = self.with_model(json!({
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
            "temperature": 0,
            "max_tokens": max_tokens,
        }));
        let start = Instant::now();
        let mut response =
            self.request(reqwest::Method::POST, "/v1/chat/completions").json(&body).send().await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(BenchError::Status { status: status.as_u16(), body });
        }
        let (mut decoder, mut tracker) = (SseDecoder::default(), CallTracker::default());
        while let Some(bytes) = response.chunk().await? {
            let at = start.elapsed();
            for payload in decoder.push(&bytes) {
                tracker.on_payload(&payload, at)?;
            }
        }
        if let Some(payload) = decoder.finish() {
            tracker.on_payload(&payload, start.elapsed())?;
        }
        let reply = tracker.reply().to_owned();
        Ok((tracker.finish(start.elapsed())?, reply))
    }
}

/// A session id of its own per client made in this process.
fn new_session_id() -> String {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("spindle-bench-{}-{n}", std::process::id())
}

fn messages(system: &str, user: &str) -> Value {
    json!([{"role": "system", "content": system}, {"role": "user", "content": user}])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_forms() {
        for url in ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"] {
            assert_eq!(Client::new(url, None).unwrap().base_url(), "http://h:1", "{url}");
        }
    }

    #[tokio::test]
    async fn every_request_names_the_clients_session_for_sticky_routing() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client =
            Client::new(&format!("http://{}", listener.local_addr().unwrap()), None).unwrap();
        let other = Client::new("http://h:1", None).unwrap();
        assert_ne!(client.session(), other.session(), "each client its own session");
        client.set_session("agent-7");
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let read = socket.read(&mut head).await.unwrap();
            socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            String::from_utf8_lossy(&head[..read]).to_lowercase()
        });
        assert!(client.is_ready().await);
        let head = server.await.unwrap();
        assert!(head.contains("x-session-id: agent-7\r\n"), "{head}");
    }
}
