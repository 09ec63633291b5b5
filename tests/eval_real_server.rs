//! `spindle eval --tier smoke` and a short `spindle bench agentic` against a real
//! `spindle serve` (this build, smollm2-135m, loopback): the eval passes and the bench writes
//! its JSON.

use std::path::Path;
use std::process::Command;

use spindle_bench::cli::server_process::{ServeCommand, ServerProcess};

const KEY: &str = "eval-test-key";

/// `spindle serve` (this build) for smollm2-135m on a port the system picks, with its log in
/// `dir`/serve.log; stopped when dropped.
fn start_server(dir: &Path) -> ServerProcess {
    ServerProcess::start(ServeCommand {
        program: env!("CARGO_BIN_EXE_spindle").into(),
        model: "smollm2-135m".into(),
        host: "127.0.0.1".into(),
        port: 0,
        args: ["--ctx-size", "2048", "--kv-cache-memory", "256MiB", "--batch-dir"]
            .into_iter()
            .map(String::from)
            .chain([dir.join("batches").display().to_string()])
            .collect(),
        api_key: Some(KEY.into()),
        log: dir.join("serve.log"),
        ready_timeout: None,
        scratch_dir: None,
    })
    .unwrap_or_else(|e| panic!("{e:#}"))
}

fn spindle(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .env("RUST_LOG", "error")
        .env_remove("SPINDLE_API_KEY")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn eval_smoke_and_bench_agentic_against_spindle_serve() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path());
    let url = server.base_url();
    let out = dir.path().join("out");
    let out_arg = out.to_str().unwrap();

    let (ok, text) = spindle(&[
        "eval",
        "--base-url",
        url,
        "--api-key",
        KEY,
        "--tier",
        "smoke",
        "--output",
        out_arg,
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("eval: PASS"), "{text}");
    let log = std::fs::read_to_string(out.join("eval.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // stop, max-tokens, exact-replay, prefix-cache-hit, usage-sum, bad-body-400,
    // unknown-route-404, cors-preflight: each provokable against Spindle, so none is skipped.
    assert_eq!(lines.len(), 8, "{log}");
    assert!(
        lines.iter().all(|l| l["outcome"] == "pass" || l["kind"] == "model-dependent"),
        "{log}"
    );
    assert!(out.join("eval.html").exists());

    // `bench agentic` with a short system prompt and answers, plus `extra` flags.
    let agentic = |extra: &[&str]| {
        let mut args = vec!["bench", "agentic", "--base-url", url, "--api-key", KEY];
        args.extend(["--system-tokens", "300", "--max-tokens", "4", "--runs", "1"]);
        args.extend(extra);
        args.extend(["--output", out_arg]);
        spindle(&args)
    };
    let (ok, text) = agentic(&[]);
    assert!(ok, "{text}");
    let doc = read_json(&out.join("agentic.json"));
    let phases = doc["agentic"]["runs"][0]["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 5, "{doc}");
    assert!(phases.iter().all(|p| p["prompt_tokens"].as_u64() > Some(0)), "{doc}");

    // `--restart-cmd`: the command runs, the server is awaited, the cold-prefix phase follows
    // (the command only leaves a mark here; the server it names stays up). A failing command
    // fails the panel.
    let mark = dir.path().join("restarted");
    let restart = format!("touch {}", mark.display());
    let (ok, text) = agentic(&["--restart-cmd", &restart]);
    assert!(ok && mark.exists(), "{text}");
    let doc = read_json(&out.join("agentic.json"));
    let phases = doc["agentic"]["runs"][0]["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 6, "{doc}");
    let (ok, text) = agentic(&["--restart-cmd", "false"]);
    assert!(!ok && text.contains("--restart-cmd failed"), "{text}");
}

#[test]
fn eval_exits_non_zero_when_server_checks_fail() {
    // A listener that hangs up on every connection: every request fails, so every server check
    // does. It stays bound for the whole test, so no other process can take its port meanwhile.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || listener.incoming().for_each(drop));
    let (ok, text) = spindle(&["eval", "--base-url", &url, "--tier", "smoke"]);
    assert!(!ok, "{text}");
    assert!(text.contains("server checks: 0 passed, 8 failed, 0 skipped"), "{text}");
    assert!(text.contains("error: server checks failed"), "{text}");
}
