//! The KV-cache events' topic names the replica by the HTTP port it really listens on, also
//! when `--port 0` let the system pick it: routers match a replica's events to its address.

use std::process::{Command, Stdio};

use crate::common::{model_id, LoggedServer};

/// Subscribes to ENDPOINT, says so, and prints the first message's topic.
const SUBSCRIBER: &str = r#"
import sys, zmq
sub = zmq.Context().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.setsockopt(zmq.RCVTIMEO, 600000)
sub.connect(sys.argv[1])
print("subscribed", flush=True)
print(sub.recv_multipart()[0].decode(), flush=True)
"#;

/// The address after `prefix` in the server's log.
fn logged_address(log: &str, prefix: &str) -> String {
    let line = log.lines().find_map(|l| l.split(prefix).nth(1)).unwrap_or_else(|| {
        panic!("no {prefix:?} line in\n{log}");
    });
    line.split([' ', ',']).next().unwrap().to_string()
}

#[test]
fn the_events_topic_names_the_port_the_server_listens_on() {
    let server = LoggedServer::start(&["--kv-events-endpoint", "tcp://127.0.0.1:0"]);
    let log = server.log();
    let events = logged_address(&log, "KV-cache events on ");
    let http = logged_address(&log, "listening on http://");
    let python = spindle_hub::spindle_home().join("venv-openai/bin/python");
    let mut subscriber = Command::new(&python)
        .args(["-c", SUBSCRIBER, &events])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (.ci/run installs pyzmq there)", python.display()));
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(subscriber.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "subscribed");
    // A PUB socket drops messages until a subscription arrives: send until one gets through.
    // Each prompt its own, so that each stores a block the cache did not hold.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(lines.next()));
    let topic = (0..).find_map(|round| {
        let body = serde_json::json!({"max_tokens": 2, "messages": [{"role": "user",
            "content": format!("Question {round}: how many legs does a spider have?")}]});
        server.post_ok("/v1/chat/completions", &body.to_string());
        rx.recv_timeout(std::time::Duration::from_millis(200)).ok()
    });
    let topic = topic.unwrap().unwrap().unwrap();
    let _ = subscriber.kill();
    let _ = subscriber.wait();
    server.stop();
    let port = http.rsplit(':').next().unwrap();
    assert_ne!(port, "0");
    assert_eq!(topic, format!("kv@127.0.0.1:{port}@{}", model_id()));
}
