//! `spindle eval` against a small OpenAI-compatible mock with switchable faults: the healthy
//! mock passes every server check, and each fault makes the check written for it fail (so every
//! such check is shown able to fail). The bench's agentic verdict says NO when the mock stops
//! reusing its cache.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use spindle_bench::agentic::{run_panel, AgenticOptions, NoRestart};
use spindle_bench::eval::{passed, run_eval, CheckResult, Dependence, EvalContext, Outcome, Tier};
use spindle_bench::{Client, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "mock-key";
const MODEL: &str = "mock-1";
/// Chat calls the mock holds at once; one more is refused with 429.
const CAPACITY: usize = 20;
/// Largest body the mock reads as a request; a larger one gets 413.
const BODY_LIMIT: usize = 1 << 20;
/// Time per prompt token read rather than taken from the cache, so cached calls start sooner.
const PREFILL_PER_TOKEN: Duration = Duration::from_micros(500);
/// Time every chat call takes at least, so concurrent calls overlap.
const BASE_DELAY: Duration = Duration::from_millis(30);

/// One way the mock misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Healthy,
    /// `completion_tokens` one more than generated (and `total_tokens` not their sum).
    WrongUsage,
    /// Reasoning inside `<think>` tags in `content`, none in `reasoning_content`.
    ReasoningInContent,
    /// A streamed tool call's arguments sent whole once more after their fragments.
    DuplicatedToolArguments,
    /// 500 instead of 400 for a body it cannot read.
    ServerErrorOnBadBody,
    /// `cached_tokens` always 0, and every prompt read in full.
    NoCacheReuse,
    /// `stop` ignored.
    StopIgnored,
    /// Each answer to "repeat this code" also carries the previous caller's code.
    LeakOtherRequest,
}

struct Mock {
    fault: Fault,
    /// System prompts seen: a repeated one is served from the "cache".
    systems: Mutex<HashSet<String>>,
    last_code: Mutex<String>,
    in_flight: AtomicUsize,
}

async fn start_mock(fault: Fault) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mock = Arc::new(Mock {
        fault,
        systems: Mutex::default(),
        last_code: Mutex::default(),
        in_flight: AtomicUsize::new(0),
    });
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(serve(socket, mock.clone()));
        }
    });
    url
}

struct Request {
    method: String,
    path: String,
    authorized: bool,
    /// `None` for a body over [`BODY_LIMIT`] (read and dropped).
    body: Option<Vec<u8>>,
}

async fn read_request(socket: &mut TcpStream) -> Request {
    let (mut data, mut buf) = (Vec::new(), vec![0u8; 1 << 16]);
    let head_end = loop {
        let n = socket.read(&mut buf).await.unwrap();
        data.extend_from_slice(&buf[..n]);
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_lowercase();
    let header =
        |name: &str| head.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()));
    let length: usize = header("content-length:").map_or(0, |v| v.parse().unwrap());
    let authorized = header("authorization:").as_deref() == Some(&format!("bearer {KEY}"));
    // A body over the limit is read to its end (so the client sees the reply, not a reset)
    // but not kept.
    let mut received = data.len() - head_end;
    while received < length {
        let n = socket.read(&mut buf).await.unwrap();
        received += n;
        if length <= BODY_LIMIT {
            data.extend_from_slice(&buf[..n]);
        }
    }
    let mut words = head.lines().next().unwrap().split(' ').map(str::to_string);
    let (method, path) = (words.next().unwrap().to_uppercase(), words.next().unwrap());
    let body = (length <= BODY_LIMIT).then(|| data[head_end..].to_vec());
    Request { method, path, authorized, body }
}

async fn reply(socket: &mut TcpStream, status: &str, extra_headers: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra_headers}\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body.as_bytes()).await.unwrap();
}

async fn error(socket: &mut TcpStream, status: &str, kind: &str) {
    let body = json!({"error": {"message": format!("mock: {status}"), "type": kind}});
    reply(socket, status, "", &body.to_string()).await
}

async fn serve(mut socket: TcpStream, mock: Arc<Mock>) {
    let request = read_request(&mut socket).await;
    if request.method == "OPTIONS" {
        let cors = "access-control-allow-origin: *\r\naccess-control-allow-methods: GET, POST\r\n\
                    access-control-allow-headers: authorization, content-type\r\n";
        return reply(&mut socket, "204 No Content", cors, "").await;
    }
    match (request.path.as_str(), request.body) {
        ("/health", _) => reply(&mut socket, "200 OK", "", r#"{"status":"ok"}"#).await,
        (_, None) => error(&mut socket, "413 Payload Too Large", "invalid_request_error").await,
        (path, _) if path.starts_with("/v1/") && !request.authorized => {
            error(&mut socket, "401 Unauthorized", "authentication_error").await
        }
        ("/v1/models", _) => {
            let list = json!({"object": "list", "data": [{"id": MODEL}]}).to_string();
            reply(&mut socket, "200 OK", "", &list).await
        }
        ("/v1/chat/completions", Some(body)) => chat(&mut socket, &mock, &body).await,
        _ => error(&mut socket, "404 Not Found", "not_found_error").await,
    }
}

async fn chat(socket: &mut TcpStream, mock: &Mock, body: &[u8]) {
    let bad_body = if mock.fault == Fault::ServerErrorOnBadBody {
        "500 Internal Server Error"
    } else {
        "400 Bad Request"
    };
    let body = match serde_json::from_slice::<Value>(body) {
        Ok(body) if body["messages"].is_array() => body,
        _ => return error(socket, bad_body, "invalid_request_error").await,
    };
    if body["model"] != MODEL {
        return error(socket, "404 Not Found", "not_found_error").await;
    }
    if body["top_logprobs"].as_i64().is_some_and(|n| !(0..=20).contains(&n)) {
        return error(socket, "400 Bad Request", "invalid_request_error").await;
    }
    if mock.in_flight.fetch_add(1, Ordering::SeqCst) >= CAPACITY {
        mock.in_flight.fetch_sub(1, Ordering::SeqCst);
        return error(socket, "429 Too Many Requests", "rate_limit_error").await;
    }
    let answer = generate(mock, &body);
    tokio::time::sleep(BASE_DELAY + PREFILL_PER_TOKEN * (answer.prompt - answer.cached)).await;
    if body["stream"] == true {
        stream(socket, mock.fault, &body, &answer).await;
    } else {
        let text = whole(mock.fault, &body, &answer).to_string();
        reply(socket, "200 OK", "", &text).await;
    }
    mock.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// What the mock "model" answers.
struct Answer {
    reasoning: Vec<String>,
    tokens: Vec<String>,
    calls: Vec<(String, String)>,
    finish: &'static str,
    prompt: u32,
    cached: u32,
}

impl Answer {
    fn content(&self) -> String {
        self.tokens.concat()
    }
}

fn generate(mock: &Mock, body: &Value) -> Answer {
    let messages = body["messages"].as_array().unwrap();
    let text_of = |m: &Value| m["content"].as_str().unwrap_or_default().to_string();
    let user = messages.last().map(text_of).unwrap_or_default();
    let prompt = (messages.iter().map(|m| text_of(m).len()).sum::<usize>() / 4 + 1) as u32;
    let system = messages.iter().find(|m| m["role"] == "system").map(text_of);
    let cached = match system {
        Some(system) if mock.fault != Fault::NoCacheReuse => {
            let seen = !mock.systems.lock().unwrap().insert(system.clone());
            if seen {
                (system.len() / 4) as u32
            } else {
                0
            }
        }
        _ => 0,
    };
    let choice = &body["tool_choice"];
    let (mut tokens, mut calls) = (Vec::new(), Vec::new());
    if body.get("tools").is_some() && choice != "none" {
        calls.push(match choice["function"]["name"].as_str() {
            Some("get_time") => ("get_time".into(), r#"{"timezone":"UTC"}"#.into()),
            _ => ("get_weather".into(), r#"{"city":"Paris","days":3}"#.into()),
        });
    } else if body["response_format"]["type"] == "json_schema" {
        tokens = vec![r#"{"name": "Ann", "#.into(), r#""age": 31}"#.into()];
    } else if let Some(code) = user.strip_prefix("Repeat this code exactly, and nothing else: ") {
        let previous = std::mem::replace(&mut *mock.last_code.lock().unwrap(), code.into());
        tokens.push(code.to_string());
        if mock.fault == Fault::LeakOtherRequest {
            tokens.push(format!(" {previous}"));
        }
    } else if let (Some(seed), true) = (body["seed"].as_i64(), body["temperature"] != 0) {
        tokens = (0..40).map(|k| format!("s{seed}w{k} ")).collect();
    } else {
        tokens = (1..=40).map(|k| format!("{k}, ")).collect();
    }
    let limit = body["max_completion_tokens"].as_u64().or(body["max_tokens"].as_u64());
    let limit = limit.unwrap_or(64) as usize;
    let mut finish = if calls.is_empty() { "stop" } else { "tool_calls" };
    if tokens.len() > limit {
        tokens.truncate(limit);
        finish = "length";
    }
    let stops: Vec<String> = match &body["stop"] {
        Value::Array(s) => s.iter().filter_map(|s| s.as_str().map(str::to_string)).collect(),
        Value::String(s) => vec![s.clone()],
        _ => Vec::new(),
    };
    if mock.fault != Fault::StopIgnored {
        if let Some(cut) = stops.iter().filter_map(|s| tokens.concat().find(s.as_str())).min() {
            tokens = cut_tokens(&tokens, cut);
            finish = "stop";
        }
    }
    let thinking = body["chat_template_kwargs"]["enable_thinking"] == true;
    let budget = body["thinking_budget"].as_u64().unwrap_or(12).min(12) as usize;
    let reasoning =
        if thinking { (0..budget).map(|k| format!("think{k} ")).collect() } else { vec![] };
    Answer { reasoning, tokens, calls, finish, prompt, cached }
}

/// The tokens up to byte `cut` of their text, the last one shortened.
fn cut_tokens(tokens: &[String], cut: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    for t in tokens {
        if at >= cut {
            break;
        }
        out.push(t[..t.len().min(cut - at)].to_string());
        at += t.len();
    }
    out
}

fn usage(fault: Fault, answer: &Answer) -> Value {
    let completion = (answer.tokens.len() + answer.reasoning.len() + answer.calls.len()) as u32;
    let reported = if fault == Fault::WrongUsage { completion + 1 } else { completion };
    json!({"prompt_tokens": answer.prompt, "completion_tokens": reported,
        "total_tokens": answer.prompt + completion,
        "prompt_tokens_details": {"cached_tokens": answer.cached},
        "completion_tokens_details": {"reasoning_tokens": answer.reasoning.len()}})
}

fn logprob(token: &str, top: usize) -> Value {
    let alternatives = [(token, -0.25), ("x", -1.5), ("y", -2.5), ("z", -3.5)];
    let top: Vec<Value> =
        alternatives.iter().take(top).map(|(t, l)| json!({"token": t, "logprob": l})).collect();
    json!({"token": token, "logprob": -0.25, "bytes": token.as_bytes(), "top_logprobs": top})
}

/// `(reasoning_content, content)` as the fault has it.
fn split(fault: Fault, answer: &Answer) -> (String, String) {
    let reasoning = answer.reasoning.concat();
    if fault == Fault::ReasoningInContent && !reasoning.is_empty() {
        (String::new(), format!("<think>{reasoning}</think>{}", answer.content()))
    } else {
        (reasoning, answer.content())
    }
}

fn whole(fault: Fault, body: &Value, answer: &Answer) -> Value {
    let (reasoning, content) = split(fault, answer);
    let mut message = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !answer.calls.is_empty() {
        message["content"] = Value::Null;
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({"id": format!("call_{i}"), "type": "function",
                "function": {"name": name, "arguments": args}})
            })
            .collect();
        message["tool_calls"] = json!(calls);
    }
    let mut choice = json!({"index": 0, "message": message, "finish_reason": answer.finish});
    if body["logprobs"] == true {
        let top = body["top_logprobs"].as_u64().unwrap_or(0) as usize;
        let entries: Vec<Value> = answer.tokens.iter().map(|t| logprob(t, top)).collect();
        choice["logprobs"] = json!({"content": entries});
    }
    json!({"id": "mock", "object": "chat.completion", "model": MODEL, "choices": [choice],
        "usage": usage(fault, answer)})
}

async fn stream(socket: &mut TcpStream, fault: Fault, body: &Value, answer: &Answer) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let mut out = head.to_string();
    let chunk = |delta: Value, extra: Value| {
        let mut choice = json!({"index": 0, "delta": delta, "finish_reason": null});
        if let (Some(choice), Value::Object(extra)) = (choice.as_object_mut(), extra) {
            choice.extend(extra);
        }
        format!("data: {}\n\n", json!({"object": "chat.completion.chunk", "choices": [choice]}))
    };
    out += &chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    let (reasoning, content) = split(fault, answer);
    for piece in answer.reasoning.iter().filter(|_| !reasoning.is_empty()) {
        out += &chunk(json!({"reasoning_content": piece}), Value::Null);
    }
    let logprobs = body["logprobs"] == true;
    let top = body["top_logprobs"].as_u64().unwrap_or(0) as usize;
    if content != answer.content() {
        // Think tags in the content: sent as one piece.
        out += &chunk(json!({"content": content}), Value::Null);
    } else {
        for token in &answer.tokens {
            let extra = if logprobs {
                json!({"logprobs": {"content": [logprob(token, top)]}})
            } else {
                Value::Null
            };
            out += &chunk(json!({"content": token}), extra);
        }
    }
    for (i, (name, args)) in answer.calls.iter().enumerate() {
        let call = |function: Value| json!({"tool_calls": [{"index": i, "function": function}]});
        let mut opening = call(json!({"name": name, "arguments": ""}));
        opening["tool_calls"][0]["id"] = json!(format!("call_{i}"));
        opening["tool_calls"][0]["type"] = json!("function");
        out += &chunk(opening, Value::Null);
        let (a, b) = args.split_at(args.len() / 2);
        out += &chunk(call(json!({"arguments": a})), Value::Null);
        out += &chunk(call(json!({"arguments": b})), Value::Null);
        if fault == Fault::DuplicatedToolArguments {
            out += &chunk(call(json!({"arguments": args})), Value::Null);
        }
    }
    out += &chunk(json!({}), json!({"finish_reason": answer.finish}));
    if body["stream_options"]["include_usage"] == true {
        out += &format!("data: {}\n\n", json!({"choices": [], "usage": usage(fault, answer)}));
    }
    out += "data: [DONE]\n\n";
    socket.write_all(out.as_bytes()).await.unwrap();
}

async fn eval(fault: Fault, section: Option<&str>) -> Vec<CheckResult> {
    eval_tier(fault, section, Tier::Standard).await
}

async fn eval_tier(fault: Fault, section: Option<&str>, tier: Tier) -> Vec<CheckResult> {
    let url = start_mock(fault).await;
    let mut client = Client::new(&url, Some(KEY.to_string())).unwrap();
    client.discover_model().await;
    let context = EvalContext { client, tier, queue_capacity: Some(CAPACITY), salt: 7 };
    run_eval(&context, section, &mut |_| {}).await.unwrap()
}

fn outcome(results: &[CheckResult], name: &str) -> Outcome {
    let result = results.iter().find(|r| r.name == name);
    result.unwrap_or_else(|| panic!("no check {name} in {results:#?}")).outcome
}

#[tokio::test]
async fn the_healthy_mock_passes_every_server_check() {
    let results = eval_tier(Fault::Healthy, None, Tier::Full).await;
    let server: Vec<&CheckResult> =
        results.iter().filter(|r| r.dependence == Dependence::Server).collect();
    let not_passed: Vec<&&CheckResult> =
        server.iter().filter(|r| r.outcome != Outcome::Pass).collect();
    assert!(not_passed.is_empty(), "{not_passed:#?}");
    assert_eq!(server.len(), 33, "{server:#?}");
    assert!(passed(&results));
    // The mock counts instead of writing JSON it was only asked for: a model-dependent failure,
    // which leaves the run passing.
    let unconstrained = results.iter().find(|r| r.name == "json-unconstrained").unwrap();
    assert_eq!(
        (unconstrained.dependence, unconstrained.outcome),
        (Dependence::Model, Outcome::Fail)
    );
    assert_eq!(outcome(&results, "nonce-echo"), Outcome::Pass);
}

/// Runs `section` against the mock with `fault`: each of `checks` fails there and passes
/// against the healthy mock, and the run fails.
async fn fault_fails(fault: Fault, section: &str, checks: &[&str]) {
    let healthy = eval(Fault::Healthy, Some(section)).await;
    let broken = eval(fault, Some(section)).await;
    for name in checks {
        assert_eq!(outcome(&healthy, name), Outcome::Pass, "{name} healthy: {healthy:#?}");
        assert_eq!(outcome(&broken, name), Outcome::Fail, "{name} under {fault:?}: {broken:#?}");
    }
    assert!(!passed(&broken));
}

#[tokio::test]
async fn wrong_usage_fails_the_usage_checks() {
    fault_fails(Fault::WrongUsage, "protocol", &["usage-sum", "usage-streamed"]).await;
}

#[tokio::test]
async fn reasoning_in_content_fails_the_split_checks() {
    let checks = ["reasoning-split", "reasoning-split-streamed"];
    fault_fails(Fault::ReasoningInContent, "reasoning", &checks).await;
}

#[tokio::test]
async fn duplicated_tool_arguments_fail_the_streamed_call_check() {
    fault_fails(Fault::DuplicatedToolArguments, "tools", &["tool-call-streamed"]).await;
}

#[tokio::test]
async fn a_500_on_a_bad_body_fails_the_400_checks() {
    let checks = ["bad-body-400", "wrong-type-400"];
    fault_fails(Fault::ServerErrorOnBadBody, "protocol", &checks).await;
}

#[tokio::test]
async fn no_cache_reuse_fails_the_cache_check() {
    fault_fails(Fault::NoCacheReuse, "serving", &["prefix-cache-hit"]).await;
}

#[tokio::test]
async fn an_ignored_stop_fails_the_stop_checks() {
    let checks = ["stop", "stop-streamed", "stop-bare-string"];
    fault_fails(Fault::StopIgnored, "sampling", &checks).await;
}

#[tokio::test]
async fn a_leaked_request_fails_the_isolation_checks() {
    fault_fails(Fault::LeakOtherRequest, "serving", &["concurrency-isolation"]).await;
    let streamed = "concurrency-isolation-streamed";
    let full = eval_tier(Fault::LeakOtherRequest, Some("serving"), Tier::Full).await;
    assert_eq!(outcome(&full, streamed), Outcome::Fail, "{full:#?}");
}

async fn agentic_verdict(fault: Fault) -> Option<Verdict> {
    let url = start_mock(fault).await;
    let mut client = Client::new(&url, Some(KEY.to_string())).unwrap();
    client.discover_model().await;
    let options = AgenticOptions { salt: 3, system_tokens: 1000, max_tokens: 8, runs: 1 };
    let panel = run_panel(&client, &options, &mut NoRestart, &mut |_| {}, &mut |_| {}).await;
    panel.unwrap().verdict()
}

#[tokio::test]
async fn the_agentic_verdict_says_no_without_cache_reuse() {
    assert_eq!(agentic_verdict(Fault::Healthy).await, Some(Verdict::Yes));
    assert_eq!(agentic_verdict(Fault::NoCacheReuse).await, Some(Verdict::No));
}
