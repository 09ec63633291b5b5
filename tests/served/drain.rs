//! The drain on SIGTERM, as a router or a service manager sees it: requests in flight end
//! whole, a request after the signal gets a 503 with `Retry-After` (not a reset), `/health`
//! answers 503, and the process exits by itself; a second signal exits at once. The load
//! report and the pool's shape are read while the requests run.
//!
//! A request stays in flight for as long as its client does not read: the engine holds back a
//! sequence whose client has not read its last events, and each of these answers (400 tokens
//! with 20 alternatives each, about 700 KB) is larger than what the sockets buffer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::LoggedServer;

/// Far longer than any of these waits takes; a bound that only a hang reaches.
const HANG: Duration = Duration::from_secs(300);

fn tiny_server(extra: &[&str]) -> LoggedServer {
    let spindle_hub::ModelFiles::Safetensors { dir } = spindle_testkit::tiny_model() else {
        unreachable!("the tiny model is a safetensors folder")
    };
    LoggedServer::serving(&dir, extra)
}

/// A streamed chat request whose status line has been read and whose body has not.
fn held_request(server: &LoggedServer) -> TcpStream {
    let body = r#"{"messages": [{"role": "user", "content": "Say a lot."}], "max_tokens": 400,
        "temperature": 0, "stream": true, "logprobs": true, "top_logprobs": 20}"#;
    let mut client = server.connect();
    write!(
        client,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: spindle\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = [0u8; 12];
    client.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
    client
}

/// Polls `GET path` until `done` holds of the response.
fn poll_until(server: &LoggedServer, path: &str, done: impl Fn(&str) -> bool) -> String {
    let start = std::time::Instant::now();
    loop {
        let response = server.get(path);
        if done(&response) {
            return response;
        }
        assert!(start.elapsed() < HANG, "{path} never changed: {response}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_finishes_requests_in_flight_refuses_new_ones_and_exits() {
    let mut server = tiny_server(&["--max-concurrent", "2", "--shutdown-grace-seconds", "600"]);
    let held = [held_request(&server), held_request(&server), held_request(&server)];
    // Two run (held back by their clients), the third waits for a slot.
    poll_until(&server, "/get_load", |r| r.ends_with(r#"{"load":3}"#));
    let metrics = server.get("/metrics");
    let shape = metrics.lines().find(|l| l.starts_with("vllm:cache_config_info{")).unwrap();
    // --kv-cache-memory 64MiB at the tiny model's 0.5 KiB per position: 8,192 blocks of 16.
    assert!(shape.ends_with(r#"block_size="16",num_gpu_blocks="8192"} 1"#), "{shape}");
    assert!(metrics.contains("vllm:num_requests_running{model_name="), "{metrics}");

    server.signal(libc::SIGTERM);
    let health = poll_until(&server, "/health", |r| r.starts_with("HTTP/1.1 503"));
    assert!(health.contains(r#""status":"draining""#), "{health}");
    let refused = server.post(
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}"#,
    );
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: "), "{refused}");
    assert!(refused.contains(r#"{"error":{"message":"the server is shutting down"#), "{refused}");
    let anthropic = server.post(
        "/v1/messages",
        r#"{"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    assert!(anthropic.contains(r#""type":"error","error":{"type":"#), "{anthropic}");

    for mut client in held {
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert!(answer.contains(r#""finish_reason":"length""#), "{answer}");
        assert!(answer.contains("data: [DONE]"), "{answer}");
    }
    let status = server.wait_for_exit(HANG);
    assert!(status.success(), "{status}:\n{}", server.log());
    assert!(server.log().contains("drained: every request in flight has ended"));
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut server = tiny_server(&["--shutdown-grace-seconds", "600"]);
    let _held = held_request(&server);
    server.signal(libc::SIGINT);
    poll_until(&server, "/health", |r| r.starts_with("HTTP/1.1 503"));
    server.signal(libc::SIGTERM);
    // Well within the grace period, which the held request would otherwise fill.
    let status = server.wait_for_exit(HANG);
    assert!(!status.success(), "{status}");
    assert!(server.log().contains("exiting without waiting for the drain"), "{}", server.log());
}

#[test]
fn requests_still_running_when_the_grace_period_ends_are_cancelled() {
    let mut server = tiny_server(&["--shutdown-grace-seconds", "1"]);
    let _held = held_request(&server);
    server.signal(libc::SIGTERM);
    let status = server.wait_for_exit(HANG);
    assert!(status.success(), "{status}");
    assert!(server.log().contains("requests still in flight cancelled"), "{}", server.log());
}
