//! The client and both workloads against a scripted HTTP server on a local socket: request
//! bodies as sent, streams read, timings bounded, errors counted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use spindle_bench::agentic::{agent_calls, run_panel, AgenticOptions, NoRestart, Restart};
use spindle_bench::burst::{run_burst, run_bursts};
use spindle_bench::conversation::{run_conversation, ConversationOptions};
use spindle_bench::gates::{GateWatch, Probe};
use spindle_bench::quality::{run_code, run_instruct, Thinking, SEED};
use spindle_bench::results::{Meta, Results};
use spindle_bench::{BenchError, Client, PhaseKind, TokenCount, Verdict, Workload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Delay before the first content chunk of every chat stream.
const FIRST_TOKEN_DELAY: Duration = Duration::from_millis(30);
/// Delay before the first content chunk of a call the mock serves without cache: user
/// message 0 (the cold and warm phases, a burst's warm-up, every conversation turn).
const COLD_DELAY: Duration = Duration::from_millis(300);

/// Delay between the two content chunks of every chat stream: the answer streams for a while.
const DECODE_DELAY: Duration = Duration::from_millis(20);

/// Characters of message content the mock accepts in one chat call (a context limit).
const CONTEXT_CHARS: usize = 6000;

/// How the mock takes streamed chat calls that arrive together.
#[derive(Clone, Copy, PartialEq)]
enum Serving {
    Together,
    /// One after another, as a single-slot server does.
    OneAtATime,
}

/// Serves until the test ends; records every chat request body.
async fn start_mock() -> (String, Arc<Mutex<Vec<Value>>>) {
    start_mock_serving(Serving::Together).await
}

async fn start_mock_serving(serving: Serving) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let slot = (serving == Serving::OneAtATime).then(|| Arc::new(tokio::sync::Mutex::new(())));
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(answer(socket, log.clone(), slot.clone()));
        }
    });
    (url, seen)
}

pub(crate) async fn read_request(socket: &mut TcpStream) -> (String, Value) {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut buf).await.unwrap();
        data.extend_from_slice(&buf[..n]);
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = socket.read(&mut buf).await.unwrap();
        data.extend_from_slice(&buf[..n]);
    }
    let line = head.lines().next().unwrap().to_string();
    let body =
        if length > 0 { serde_json::from_slice(&data[head_end..]).unwrap() } else { Value::Null };
    (line, body)
}

pub(crate) async fn reply(socket: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(body.as_bytes()).await.unwrap();
}

/// Fake tokens: one per byte of each message's content, so shared prefixes are exact.
fn fake_tokens(body: &Value) -> Vec<u32> {
    match body.get("messages") {
        Some(messages) => messages
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_str().unwrap().bytes())
            .map(u32::from)
            .collect(),
        // Three characters per token for raw text.
        None => vec![0; body["prompt"].as_str().unwrap().len() / 3],
    }
}

/// `slot`, when given, is held for the whole of each streamed chat call.
async fn answer(
    mut socket: TcpStream,
    seen: Arc<Mutex<Vec<Value>>>,
    slot: Option<Arc<tokio::sync::Mutex<()>>>,
) {
    let (line, body) = read_request(&mut socket).await;
    match line.split(' ').nth(1).unwrap() {
        "/health" => reply(&mut socket, "200 OK", "application/json", r#"{"status":"ok"}"#).await,
        "/v1/models" => {
            reply(
                &mut socket,
                "200 OK",
                "application/json",
                r#"{"object":"list","data":[{"id":"mock-1"}]}"#,
            )
            .await
        }
        "/metrics" => {
            let text = "# TYPE process_resident_memory_bytes gauge\n\
                        process_resident_memory_bytes 3.0e8\n\
                        vllm:kv_cache_usage_perc{engine=\"0\"} 0.375\n";
            reply(&mut socket, "200 OK", "text/plain; version=0.0.4", text).await
        }
        "/v1/tokenize" => {
            let tokens = fake_tokens(&body);
            let text =
                json!({"tokens": tokens, "count": tokens.len(), "max_model_len": 8192}).to_string();
            reply(&mut socket, "200 OK", "application/json", &text).await
        }
        "/v1/chat/completions" => {
            seen.lock().unwrap().push(body.clone());
            if body["stream"] == false {
                return probe_reply(&mut socket, &body).await;
            }
            if fake_tokens(&body).len() > CONTEXT_CHARS {
                let error = r#"{"error":{"message":"the prompt exceeds the context"}}"#;
                return reply(&mut socket, "400 Bad Request", "application/json", error).await;
            }
            let user = body["messages"][1]["content"].as_str().unwrap();
            if user.starts_with("Request 5:") {
                return reply(
                    &mut socket,
                    "429 Too Many Requests",
                    "application/json",
                    r#"{"error":{"message":"queue full"}}"#,
                )
                .await;
            }
            let _turn = match &slot {
                Some(slot) => Some(slot.lock().await),
                None => None,
            };
            stream_chat(&mut socket, user).await;
        }
        other => panic!("unexpected path {other}"),
    }
}

/// A non-streamed answer to a quality probe. With tools: at turn `n` (tool results so far) a
/// `read_file` call, except turn 1's `edit_file` whose edits collapse to `{}`; with thinking on
/// and not preserved, HTTP 500 from turn 2 on. Without tools (the brief): all five sections
/// with thinking on, only the summary otherwise.
async fn probe_reply(socket: &mut TcpStream, body: &Value) {
    let kwargs = &body["chat_template_kwargs"];
    let thinking = kwargs["enable_thinking"] == true;
    let messages = body["messages"].as_array().unwrap();
    let turn = messages.iter().filter(|m| m["role"] == "tool").count();
    if thinking && kwargs["preserve_thinking"] == false && turn >= 2 {
        let error = r#"{"error":{"message":"context corrupted"}}"#;
        return reply(socket, "500 Internal Server Error", "application/json", error).await;
    }
    let message = if body.get("tools").is_some() {
        let (name, arguments) = match turn {
            1 => ("edit_file", r#"{"path":"src/stats.py","edits":{}}"#),
            _ => ("read_file", r#"{"path":"src/stats.py"}"#),
        };
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("m{turn}"),
            "type": "function", "function": {"name": name, "arguments": arguments}}]})
    } else if thinking {
        let brief =
            "## Summary\nYes.\n## Findings\nx\n## Risks\ny\n## Recommendation\nz\n## Next steps\nw";
        json!({"role": "assistant", "content": brief})
    } else {
        json!({"role": "assistant", "content": "## Summary\nAdopt it."})
    };
    let mut message = message;
    if thinking {
        message["reasoning_content"] = json!(format!("thinking about turn {turn}"));
    }
    let answer = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112}});
    reply(socket, "200 OK", "application/json", &answer.to_string()).await
}

/// Role chunk, a pause, a content chunk, a pause, another content chunk, the finish chunk, usage (cached tokens only for
/// the prefix calls' users), `[DONE]`.
async fn stream_chat(socket: &mut TcpStream, user: &str) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    let event = |v: Value| format!("data: {v}\n\n");
    let chunk = |delta: Value, finish: Value| {
        event(json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
    };
    socket
        .write_all(chunk(json!({"role": "assistant", "content": ""}), Value::Null).as_bytes())
        .await
        .unwrap();
    socket.flush().await.unwrap();
    let cold = user.starts_with("Request 0:");
    tokio::time::sleep(if cold { COLD_DELAY } else { FIRST_TOKEN_DELAY }).await;
    let cached = if cold { 0 } else { 500 };
    socket.write_all(chunk(json!({"content": "Hel"}), Value::Null).as_bytes()).await.unwrap();
    socket.flush().await.unwrap();
    tokio::time::sleep(DECODE_DELAY).await;
    let rest = [
        chunk(json!({"content": "lo"}), Value::Null),
        chunk(json!({}), json!("length")),
        event(
            json!({"choices": [], "usage": {"prompt_tokens": 600, "completion_tokens": 2, "total_tokens": 602,
            "prompt_tokens_details": {"cached_tokens": cached}}}),
        ),
        "data: [DONE]\n\n".to_string(),
    ];
    for text in rest {
        socket.write_all(text.as_bytes()).await.unwrap();
    }
}

#[tokio::test]
async fn agent_phases_against_the_mock() {
    let (url, seen) = start_mock().await;
    let mut client = Client::new(&format!("{url}/v1/"), None).unwrap();
    assert!(client.is_ready().await);
    client.discover_model().await;
    assert_eq!(client.model(), Some("mock-1"));

    let workload = Workload::prepare(&client, 9, 300, 16).await;
    // Sized at the server's 3 characters per token; the shared prefix is the system prompt
    // plus "Request " common to user messages 0 and 1.
    assert!(
        workload.system.len() >= 900 && workload.system.len() < 1500,
        "{}",
        workload.system.len()
    );
    assert_eq!(
        workload.system_tokens,
        TokenCount::Counted(workload.system.len() + "Request ".len())
    );

    let phases = agent_calls(&client, &workload).await.unwrap();
    let kinds: Vec<PhaseKind> = phases.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        [
            PhaseKind::Cold,
            PhaseKind::Warm,
            PhaseKind::Prefix(1),
            PhaseKind::Prefix(2),
            PhaseKind::Prefix(3)
        ]
    );
    for p in &phases {
        let m = p.measurement;
        assert!(m.ttft >= FIRST_TOKEN_DELAY && m.ttft <= m.latency, "{m:?}");
        assert_eq!((m.prompt_tokens, m.completion_tokens), (600, 2));
    }
    let cached: Vec<u32> = phases.iter().map(|p| p.measurement.cached_tokens).collect();
    assert_eq!(cached, [0, 0, 500, 500, 500]);

    let bodies = seen.lock().unwrap().clone();
    // The warm-up, then the five phases.
    assert_eq!(bodies.len(), 6);
    let cold = &bodies[1];
    assert_eq!(cold["model"], "mock-1");
    assert_eq!(cold["stream"], true);
    assert_eq!(cold["stream_options"]["include_usage"], true);
    assert_eq!(cold["temperature"], 0);
    assert_eq!(cold["max_tokens"], 16);
    assert_eq!(cold["messages"][0]["role"], "system");
    assert_eq!(cold["messages"][0]["content"], workload.system.as_str());
    assert_eq!(cold["messages"][1], bodies[2]["messages"][1], "warm repeats the cold call");
    assert_ne!(
        bodies[2]["messages"][1], bodies[3]["messages"][1],
        "prefix calls bring new user text"
    );
}

#[tokio::test]
async fn burst_counts_errors_and_rereads() {
    let (url, seen) = start_mock().await;
    let client = Client::new(&url, None).unwrap();
    let workload = Workload::prepare(&client, 9, 300, 16).await;
    // Users 2..=5: "Request 5" is refused with 429.
    let run = run_burst(&client, &workload, 0, 4).await.unwrap();
    assert_eq!(run.calls.len(), 4);
    assert_eq!(run.errors(), [r#"status 429: {"error":{"message":"queue full"}}"#]);
    assert_eq!(run.rate_limited(), 1);
    // The mock reports 500 cached tokens: below a ~1,000-token system prompt.
    assert_eq!(run.rereads(workload.system_tokens.value()), 3);
    assert_eq!(run.rereads(500 + 64), 0);
    assert_eq!(run.warm.cached_tokens, 0);
    assert_eq!(run.single.cached_tokens, 500);
    let bodies = seen.lock().unwrap().clone();
    // A burst's system prompt has its own salt.
    assert_ne!(bodies[0]["messages"][0]["content"], workload.system.as_str());
    assert!(bodies.iter().all(|b| b["messages"][0] == bodies[0]["messages"][0]));
}

#[tokio::test]
async fn bursts_at_each_level_and_run() {
    let (url, seen) = start_mock().await;
    let client = Client::new(&url, None).unwrap();
    let workload = Workload::prepare(&client, 11, 300, 16).await;
    let mut heard = Vec::new();
    let levels = run_bursts(&client, &workload, &[2, 0, 5], 2, &mut |run, round| {
        heard.push((run.concurrency, round))
    })
    .await
    .unwrap();
    assert_eq!(heard, [(2, 0), (2, 1), (5, 0), (5, 1)]);
    assert_eq!(
        levels.iter().map(|l| (l.concurrency, l.runs.len())).collect::<Vec<_>>(),
        [(2, 2), (5, 2)]
    );
    let system_tokens = workload.system_tokens.value();
    for run in &levels[1].runs {
        // Users 2..=6: "Request 5" is refused.
        let s = run.stats(system_tokens);
        assert_eq!((s.successes, s.errors, s.rate_limited), (4, 1, 1));
        assert!(s.latency_p50_ms >= 30.0 && s.latency_p50_ms <= s.latency_max_ms, "{s:?}");
        assert!(s.aggregate_tokens_per_second > 0.0 && s.per_request_tokens_per_second > 0.0);
    }
    let bodies = seen.lock().unwrap().clone();
    // Per burst: its warm-up, the lone call, then N calls.
    assert_eq!(bodies.len(), 2 * (2 + 2) + 2 * (2 + 5));
    let system = |i: usize| bodies[i]["messages"][0]["content"].clone();
    let starts = [0, 4, 8, 15];
    for (k, &start) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(bodies.len());
        assert!((start..end).all(|i| system(i) == system(start)), "burst {k} shares one prompt");
        assert!(starts[..k].iter().all(|&o| system(o) != system(start)), "burst {k} is new");
    }
}

#[tokio::test]
async fn a_burst_is_serialised_only_when_the_server_takes_one_call_at_a_time() {
    for (serving, serialised) in [(Serving::Together, false), (Serving::OneAtATime, true)] {
        let (url, _) = start_mock_serving(serving).await;
        let client = Client::new(&url, None).unwrap();
        let workload = Workload::prepare(&client, 13, 300, 16).await;
        // Users 2..=4, none refused.
        let run = run_burst(&client, &workload, 0, 3).await.unwrap();
        assert_eq!(run.succeeded().count(), 3);
        let at_once = run.streams_at_once().unwrap();
        assert_eq!(run.serialised(), serialised, "streams at once {at_once}");
    }
}

#[tokio::test]
async fn a_conversation_sends_each_tool_call_and_result_back() {
    let (url, seen) = start_mock().await;
    let mut client = Client::new(&url, None).unwrap();
    client.discover_model().await;
    let options = ConversationOptions {
        salt: 3,
        turns: 3,
        start_tokens: 300,
        end_tokens: 600,
        max_tokens: 8,
    };
    let mut heard = Vec::new();
    let run =
        run_conversation(&client, &options, &mut |m| heard.push(m.to_string())).await.unwrap();
    assert_eq!(run.turns.iter().map(|t| t.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(heard.len(), 3);
    assert!(
        heard[2].starts_with("conversation turn 3/3: 600 prompt tokens, 0 cached"),
        "{heard:?}"
    );
    for t in &run.turns {
        assert!(t.measurement.ttft >= COLD_DELAY, "{t:?}");
        assert_eq!((t.measurement.prompt_tokens, t.read()), (600, 600));
    }
    let bodies = seen.lock().unwrap().clone();
    // The warm-up, then the three turns.
    assert_eq!(bodies.len(), 4);
    let calls = &bodies[1..];
    let system = calls[0]["messages"][0]["content"].as_str().unwrap();
    // 300 tokens at the mock's 3 characters per token.
    assert!(system.len() >= 900 && system.len() < 1500, "{}", system.len());
    for (k, body) in calls.iter().enumerate() {
        assert_eq!(body["max_tokens"], 8);
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2 + 2 * k, "call {k}");
        assert_eq!(messages[..2], calls[0]["messages"].as_array().unwrap()[..]);
        for turn in 0..k {
            let (call, result) = (&messages[2 + 2 * turn], &messages[3 + 2 * turn]);
            assert_eq!(call["role"], "assistant");
            let id = format!("call_{turn}");
            assert_eq!(call["tool_calls"][0]["id"], id.as_str());
            let arguments = call["tool_calls"][0]["function"]["arguments"].as_str().unwrap();
            assert!(serde_json::from_str::<Value>(arguments).unwrap().is_object());
            assert_eq!((&result["role"], &result["tool_call_id"]), (&json!("tool"), &json!(id)));
            let text = result["content"].as_str().unwrap();
            // 100 tokens per turn at 3 characters each.
            assert!(text.starts_with(&format!("Tool result {turn}:")) && text.len() >= 300);
        }
    }
    let summary = spindle_bench::report::conversation_summary(&run);
    assert!(summary[0].starts_with("conversation: 3 turns"), "{summary:?}");
    assert!(summary[0].contains("1800 prompt tokens: 0 cached, 1800 re-read"), "{summary:?}");
}

/// Counts restarts; the mock needs none.
struct CountingRestart(usize);

impl Restart for CountingRestart {
    async fn restart(&mut self) -> Result<bool, BenchError> {
        self.0 += 1;
        Ok(true)
    }
}

#[tokio::test]
async fn agentic_panel_repeats_runs_with_a_restart_each() {
    let (url, seen) = start_mock().await;
    let mut client = Client::new(&url, None).unwrap();
    client.set_model("chosen");
    let options = AgenticOptions { salt: 5, system_tokens: 300, max_tokens: 24, runs: 2 };
    let (mut restarts, mut messages, mut salts) = (CountingRestart(0), Vec::new(), Vec::new());
    let panel = run_panel(
        &client,
        &options,
        &mut restarts,
        &mut |m| messages.push(m.to_string()),
        &mut |w| salts.push(w.salt()),
    )
    .await
    .unwrap();
    assert_eq!(restarts.0, 2);
    assert_eq!(salts, [options.run_salt(0), options.run_salt(1)]);
    assert_ne!(salts[0], salts[1]);
    assert!(messages.iter().any(|m| m == "agentic run 2/2: cold-prefix"), "{messages:?}");
    assert_eq!(panel.runs.len(), 2);
    for run in &panel.runs {
        let kinds: Vec<String> = run.iter().map(|p| p.kind.to_string()).collect();
        assert_eq!(
            kinds,
            ["cold", "warm", "prefix-test-1", "prefix-test-2", "prefix-test-3", "cold-prefix"]
        );
    }
    // Cold calls wait 300 ms, the cached ones 30 ms: a ratio near 0.1.
    let ratio = panel.ratio().unwrap();
    assert!(ratio.max < 0.2 && ratio.min > 0.05, "{ratio:?}");
    assert_eq!(panel.verdict(), Some(Verdict::Yes));
    let cold_prefix = panel.summary(PhaseKind::ColdPrefix).unwrap();
    assert_eq!(cold_prefix.cached_tokens.median, 500.0);

    let bodies = seen.lock().unwrap().clone();
    // Per run: warm-up, 5 phases, warm-up after the restart, cold-prefix.
    assert_eq!(bodies.len(), 16);
    for (i, b) in bodies.iter().enumerate() {
        let warm_up = b["messages"][0]["content"] == "You are a helpful assistant.";
        assert_eq!(warm_up, [0, 6, 8, 14].contains(&i), "call {i}");
        assert_eq!(
            (&b["model"], &b["max_tokens"]),
            (&json!("chosen"), &json!(if warm_up { 1 } else { 24 }))
        );
    }
    let system = |i: usize| bodies[i]["messages"][0]["content"].as_str().unwrap().to_string();
    assert_eq!(system(1), system(7), "cold-prefix keeps the run's system prompt");
    assert_ne!(system(1), system(9), "each run has its own system prompt");
    let user = |i: usize| bodies[i]["messages"][1]["content"].as_str().unwrap().to_string();
    assert!(user(7).starts_with("Request 4:"), "{}", user(7));

    // A server that cannot restart: no cold-prefix, no warm-up for it.
    let before = seen.lock().unwrap().len();
    let options = AgenticOptions { runs: 1, ..options };
    let panel = run_panel(&client, &options, &mut NoRestart, &mut |_| {}, &mut |_| {}).await;
    assert_eq!(panel.unwrap().runs[0].len(), 5);
    assert_eq!(seen.lock().unwrap().len() - before, 6);
}

#[tokio::test]
async fn gates_read_metrics_or_the_started_process() {
    let (url, _) = start_mock().await;
    let client = Client::new(&url, None).unwrap();
    // A remote server: memory and KV occupancy from /metrics.
    let probe = Probe::new(client.clone(), Arc::default());
    // No idle watch, no wait under load: the last sample is taken at the end either way.
    let watch = GateWatch::begin(probe, Duration::ZERO).await;
    let gates = watch.end(&[16, 16, 2, 1, 16]).await;
    assert!(gates.early_stop.tripped());
    assert_eq!(gates.memory_source, "/metrics process_resident_memory_bytes");
    assert_eq!(gates.idle.rss_bytes, Some(300_000_000));
    assert_eq!(gates.under_load.kv_usage, Some(0.375));
    assert!(gates.foreign_cores_before.is_some());
    assert_eq!(gates.foreign_cores_during, None, "the server's own work is not known");

    // A started server (this test process stands in for it): memory from /proc.
    let pid = Arc::new(std::sync::atomic::AtomicU32::new(std::process::id()));
    let watch = GateWatch::begin(Probe::new(client, pid), Duration::ZERO).await;
    let gates = watch.end(&[16, 16]).await;
    assert!(!gates.early_stop.tripped());
    assert_eq!(gates.memory_source, "/proc/PID/status VmRSS");
    let rss = gates.idle.rss_bytes.unwrap();
    assert!(rss > 1 << 20 && rss != 300_000_000, "{rss}");
    assert!(gates.foreign_cores_during.is_some());
}

#[tokio::test]
async fn a_burst_panel_writes_json_and_html() {
    let (url, _) = start_mock().await;
    let mut client = Client::new(&url, None).unwrap();
    client.discover_model().await;
    let workload = Workload::prepare(&client, 21, 300, 16).await;
    let watch = GateWatch::begin(Probe::new(client.clone(), Arc::default()), Duration::ZERO).await;
    let bursts = run_bursts(&client, &workload, &[3, 5], 1, &mut |_, _| {}).await.unwrap();
    let mut results = Results { bursts, ..Results::default() };
    results.gates = Some(watch.end(&results.completions()).await);
    let meta = Meta {
        panel: "burst".into(),
        server: url.clone(),
        model: client.model().map(str::to_string),
        seed: 21,
        max_tokens: 16,
        system_chars: workload.system.len(),
        system_tokens: workload.system_tokens,
        started_unix: 0,
    };
    let dir = std::env::temp_dir().join(format!("spindle-bench-mock-{}", std::process::id()));
    let json_path = spindle_bench::json::write(&dir, &meta, &results).unwrap();
    let html_path = spindle_bench::html::write(&dir, &meta, &results).unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(json_path).unwrap()).unwrap();
    assert_eq!((doc["panel"].clone(), doc["model"].clone()), (json!("burst"), json!("mock-1")));
    assert_eq!(doc["system_prompt"]["counted"], true);
    let levels = doc["burst"]["levels"].as_array().unwrap();
    assert_eq!(
        levels.iter().map(|l| l["concurrency"].as_u64().unwrap()).collect::<Vec<_>>(),
        [3, 5]
    );
    // Users 2..=4, then 2..=6 of which "Request 5" is refused.
    let calls = |k: usize| levels[k]["runs"][0]["calls"].as_array().unwrap().clone();
    assert!(calls(0).iter().all(|c| c["ok"] == true && c["cached_tokens"] == 500));
    let refused: Vec<Value> = calls(1).into_iter().filter(|c| c["ok"] == false).collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["status"], 429);
    assert_eq!(levels[1]["runs"][0]["stats"]["rate_limited"], 1);
    assert_eq!(doc["gates"]["kv_cache_usage"]["peak"], 0.375);
    assert_eq!(doc["gates"]["early_stop"]["calls"], 7);
    let page = std::fs::read_to_string(html_path).unwrap();
    assert_eq!(page.matches("<svg").count(), 2);
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn quality_probes_score_tool_calls_and_sections() {
    let (url, seen) = start_mock().await;
    let mut client = Client::new(&url, None).unwrap();
    client.discover_model().await;

    let off = run_code(&client, Thinking::Off, 256).await;
    assert_eq!(off.turns.len(), 8);
    // Turn 1's edits collapse to {}: the one dirty turn; the mock never edits afterwards.
    assert_eq!((off.clean(), off.edit_clean()), ((7, 8), (0, 4)));
    assert_eq!(
        off.turns[1].check.problem.as_deref(),
        Some("edit_file: edits: expected array, got object")
    );
    let bodies = seen.lock().unwrap().clone();
    assert_eq!(bodies.len(), 8);
    for (turn, body) in bodies.iter().enumerate() {
        assert_eq!((body["temperature"].clone(), body["seed"].clone()), (json!(0), json!(SEED)));
        assert_eq!(body["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(body["tools"].as_array().unwrap().len(), 4);
        let messages = body["messages"].as_array().unwrap();
        // The history holds the script's calls and results, not the model's answers.
        let calls: Vec<&Value> = messages.iter().filter(|m| m["role"] == "assistant").collect();
        assert_eq!(calls.len(), turn);
        assert!(calls.iter().all(|m| m.get("reasoning_content").is_none()));
        if turn >= 2 {
            assert_eq!(calls[1]["tool_calls"][0]["function"]["name"], "edit_file");
            let args = calls[1]["tool_calls"][0]["function"]["arguments"].as_str().unwrap();
            assert!(serde_json::from_str::<Value>(args).unwrap()["edits"].is_array());
        }
    }

    let preserved = run_code(&client, Thinking::OnPreserved, 256).await;
    assert_eq!(preserved.clean(), (7, 8));
    let last = seen.lock().unwrap().last().unwrap().clone();
    let replayed: Vec<&Value> =
        last["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "assistant").collect();
    assert_eq!(replayed[3]["reasoning_content"], "thinking about turn 3");

    // Reasoning on but dropped: HTTP 500 from turn 2 on.
    let dropped = run_code(&client, Thinking::OnDropped, 256).await;
    assert_eq!(dropped.clean(), (1, 8));
    assert!(dropped.turns[5].check.problem.as_deref().unwrap().starts_with("status 500"));

    let brief_off = run_instruct(&client, Thinking::Off, 512).await;
    let brief_on = run_instruct(&client, Thinking::OnPreserved, 512).await;
    assert_eq!((brief_off.sections, brief_on.sections), (1, 5));
    let last = seen.lock().unwrap().last().unwrap().clone();
    assert!(last.get("tools").is_none());
    assert_eq!(last["max_tokens"], 512);
}

#[tokio::test]
async fn a_conversation_past_the_context_stops_with_the_turns_so_far() {
    let (url, seen) = start_mock().await;
    let client = Client::new(&url, None).unwrap();
    // 500 tokens (1,500 characters) per turn: the fifth call passes 6,000 characters.
    let options = ConversationOptions {
        salt: 4,
        turns: 6,
        start_tokens: 300,
        end_tokens: 3300,
        max_tokens: 8,
    };
    let run = run_conversation(&client, &options, &mut |_| {}).await.unwrap();
    assert_eq!(run.turns.len(), 4);
    let stopped = run.stopped.as_deref().unwrap();
    assert!(stopped.starts_with("turn 4: status 400"), "{stopped}");
    assert_eq!(seen.lock().unwrap().len(), 1 + 5, "the warm-up, four turns, the refused one");
    let summary = spindle_bench::report::conversation_summary(&run);
    assert!(summary[0].starts_with("conversation stopped early at turn 4: status 400"));
    assert!(summary[1].starts_with("conversation: 4 turns"), "{summary:?}");
}

/// A server that answers `GET /health` and `GET /v1/models` with these statuses, and counts
/// the probes of each.
async fn start_probe_mock(health: u16, models: u16) -> (String, Arc<Mutex<[usize; 2]>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let probes = Arc::new(Mutex::new([0; 2]));
    let count = probes.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let (line, _) = read_request(&mut socket).await;
            let (which, status) = match line.split(' ').nth(1).unwrap() {
                "/health" => (0, health),
                "/v1/models" => (1, models),
                other => panic!("unexpected path {other}"),
            };
            count.lock().unwrap()[which] += 1;
            let body = r#"{"object":"list","data":[{"id":"mock-1"}]}"#;
            reply(&mut socket, &format!("{status} Status"), "application/json", body).await;
        }
    });
    (url, probes)
}

#[tokio::test]
async fn readiness_falls_back_to_the_model_list_without_a_health_endpoint() {
    // Ollama and LM Studio have no /health: the model list says the server is up.
    let (url, probes) = start_probe_mock(404, 200).await;
    assert!(Client::new(&url, None).unwrap().is_ready().await);
    assert_eq!(*probes.lock().unwrap(), [1, 1]);
    // A healthy /health is enough.
    let (url, probes) = start_probe_mock(200, 500).await;
    assert!(Client::new(&url, None).unwrap().is_ready().await);
    assert_eq!(*probes.lock().unwrap(), [1, 0]);
    // Still loading (llama-server answers 503 everywhere): not ready, and waiting times out.
    let (url, probes) = start_probe_mock(503, 503).await;
    let client = Client::new(&url, None).unwrap();
    assert!(!client.is_ready().await);
    let waited = client.wait_ready(Duration::from_millis(500)).await;
    assert!(matches!(waited, Err(BenchError::NotReady(_))), "{waited:?}");
    assert!(probes.lock().unwrap()[1] >= 2, "the model list is polled again");
}
