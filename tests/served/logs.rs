//! The server's log as an operator ships it: written to a file it holds no terminal escapes,
//! `--log-format json` writes one parseable object a line, and every request's line names its
//! endpoint and HTTP status, also one whose client left before its end.

use std::io::{Read, Write};

use crate::common::{model_id, LoggedServer};

const CHAT: &str = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
    "temperature": 0}"#;
const UNKNOWN_MODEL: &str = r#"{"model": "no-such-model", "messages": [{"role": "user",
    "content": "Hi"}]}"#;

#[test]
fn a_log_written_to_a_file_has_no_escapes_and_names_status_and_endpoint() {
    let server = LoggedServer::start(&[]);
    assert!(server.post("/v1/chat/completions", CHAT).starts_with("HTTP/1.1 200"));
    assert!(server.post("/v1/chat/completions", UNKNOWN_MODEL).starts_with("HTTP/1.1 404"));
    let log = server.stop();
    assert!(!log.contains(&0x1b), "an escape byte in:\n{}", String::from_utf8_lossy(&log));
    let log = String::from_utf8(log).unwrap();
    let line_with = |needle: &str| {
        log.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle:?} in:\n{log}"))
    };
    let done = line_with("request done");
    let model = format!("model={}", model_id());
    for field in ["endpoint=\"/v1/chat/completions\"", "status=200", &model] {
        assert!(done.contains(field), "{field} not in {done}");
    }
    let refused = line_with("request refused");
    for field in ["endpoint=\"/v1/chat/completions\"", "status=404"] {
        assert!(refused.contains(field), "{field} not in {refused}");
    }
}

#[test]
fn json_logs_are_one_object_a_line_with_the_request_fields() {
    let server = LoggedServer::start(&["--log-format", "json"]);
    assert!(server.post("/v1/chat/completions", CHAT).starts_with("HTTP/1.1 200"));
    let log = String::from_utf8(server.stop()).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for event in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(event.get(key).is_some(), "no {key} in {event}");
        }
    }
    let done = events.iter().find(|e| e["message"] == "request done").expect("a request line");
    assert_eq!(done["endpoint"], "/v1/chat/completions");
    assert_eq!(done["status"], 200);
    assert_eq!(done["model"], model_id().as_str());
    assert_eq!(done["generated"], 2);
    assert!(done["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl")), "{done}");
    for number in ["prompt", "cached", "prefill_tok_s", "decode_tok_s"] {
        assert!(done[number].is_number(), "{number} in {done}");
    }
    let summary = events.iter().find(|e| e["target"] == "spindle::startup");
    assert!(summary.is_some_and(|e| e["message"].as_str().unwrap().contains("KV cache")), "{log}");
}

#[test]
fn a_request_whose_client_leaves_has_its_line_with_status_499() {
    let server = LoggedServer::start(&[]);
    let body = r#"{"messages": [{"role": "user", "content": "Count from 1 to 1000."}],
        "max_tokens": 1000, "temperature": 0, "stream": true}"#;
    let mut client = server.connect();
    write!(
        client,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: spindle\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The status line and the first chunk, then the client leaves.
    let mut first = [0u8; 64];
    let read = client.read(&mut first).unwrap();
    assert!(first[..read].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first));
    drop(client);
    let abandoned = loop {
        let log = server.log();
        if let Some(line) = log.lines().find(|l| l.contains("request abandoned")) {
            break line.to_string();
        }
        assert!(!log.contains("request done"), "the answer ended before the client left:\n{log}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for field in
        ["endpoint=\"/v1/chat/completions\"", "status=499", &format!("model={}", model_id())]
    {
        assert!(abandoned.contains(field), "{field} not in {abandoned}");
    }
    server.stop();
}
