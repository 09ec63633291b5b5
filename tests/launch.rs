//! `spindle launch` end to end with stand-in agents: a script per agent name, first on `PATH`,
//! records the arguments and environment it was given and makes one real request to the server
//! the way that agent would (Messages for Claude Code, Responses for Codex, Chat Completions
//! for Qwen Code and OpenCode), so the wiring is checked against a real SmolLM2 server. Also
//! the error paths: an agent not installed, a model not served, a key missing, a model that
//! cannot be served.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use spindle_bench::cli::server_process::{ServeCommand, ServerProcess};

const MODEL: &str = "smollm2-135m";

/// Pulls SmolLM2 into `$SPINDLE_HOME` once, so the servers below start from the cache.
fn pull_model() {
    static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
    spindle_hub::resolve(MODEL, &spindle_hub::spindle_home(), spindle_hub::WhenMissing::Download)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The stand-in agent, one script under every agent's name. It writes what it saw to
/// `$STAND_IN_RECORD` and exits with `$STAND_IN_EXIT`.
const STAND_IN: &str = r#"
import json, os, sys, urllib.error, urllib.request

name, args = os.path.basename(sys.argv[0]), sys.argv[1:]

def override(key):
    """A Codex `-c key=value` override; values are TOML strings, written as JSON ones."""
    for flag, value in zip(args, args[1:]):
        if flag == "-c" and value.startswith(key + "="):
            return json.loads(value.split("=", 1)[1])

chat = lambda model: {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
if name == "claude":
    url, key = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", os.environ["ANTHROPIC_AUTH_TOKEN"]
    body = chat(os.environ["ANTHROPIC_MODEL"])
elif name == "codex":
    url = override("model_providers.spindle.base_url") + "/responses"
    key = os.environ[override("model_providers.spindle.env_key")]
    body = {"model": override("model"), "input": "Hi", "max_output_tokens": 8}
elif name == "qwen":
    url, key = os.environ["OPENAI_BASE_URL"] + "/chat/completions", os.environ["OPENAI_API_KEY"]
    body = chat(os.environ["OPENAI_MODEL"])
else:
    config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
    provider, model = config["model"].split("/", 1)
    options = config["provider"][provider]["options"]
    url, key, body = options["baseURL"] + "/chat/completions", options["apiKey"], chat(model)

request = urllib.request.Request(url, data=json.dumps(body).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + key})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    status = opener.open(request).status
except urllib.error.HTTPError as error:
    status = error.code
env = {k: v for k, v in os.environ.items() if k.split("_")[0] in ("ANTHROPIC", "OPENAI", "OPENCODE", "SPINDLE")}
record = {"agent": name, "args": args, "env": env, "cwd": os.getcwd(), "url": url, "status": status}
with open(os.environ["STAND_IN_RECORD"], "w") as out:
    json.dump(record, out)
sys.exit(int(os.environ.get("STAND_IN_EXIT", "0")))
"#;

/// A folder holding the stand-ins (and nothing else: it is the whole `PATH`), the folder the
/// agents run in, and where they write what they saw.
struct StandIns {
    bin: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl StandIns {
    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let python = find_python();
        let bin = tempfile::tempdir().unwrap();
        for agent in ["claude", "codex", "qwen", "opencode"] {
            let path = bin.path().join(agent);
            std::fs::write(&path, format!("#!{}\n{STAND_IN}", python.display())).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self { bin, work: tempfile::tempdir().unwrap() }
    }

    /// `spindle launch ARGS` with only the stand-ins on `PATH`.
    fn launch(&self, args: &[&str], env: &[(&str, &str)]) -> (Output, Option<Value>) {
        let record = self.work.path().join("record.json");
        let _ = std::fs::remove_file(&record);
        let output = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .arg("launch")
            .args(args)
            .current_dir(self.work.path())
            .env("PATH", self.bin.path())
            .env("STAND_IN_RECORD", &record)
            // A started server's log goes there, and with the folder when the test ends.
            .env("TMPDIR", self.work.path())
            .env_remove("SPINDLE_API_KEY")
            .envs(env.iter().copied())
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let seen = std::fs::read_to_string(&record).ok().map(|t| serde_json::from_str(&t).unwrap());
        (output, seen)
    }
}

/// The Python interpreter itself: `python3` on `PATH` may be a wrapper script (pyenv's) that
/// needs the rest of `PATH`, which the stand-ins do not get.
fn find_python() -> PathBuf {
    let output = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH (the stand-in agents are Python scripts)");
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// `spindle serve` for the test model on a port the system picks, its log in a folder of its
/// own; stopped when dropped.
struct Server {
    process: ServerProcess,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        pull_model();
        let dir = tempfile::tempdir().unwrap();
        let process = ServerProcess::start(ServeCommand {
            program: env!("CARGO_BIN_EXE_spindle").into(),
            model: MODEL.into(),
            host: "127.0.0.1".into(),
            port: 0,
            args: extra.iter().map(|a| a.to_string()).collect(),
            api_key: None,
            log: dir.path().join("serve.log"),
            ready_timeout: None,
            scratch_dir: None,
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
        Self { process, _dir: dir }
    }

    fn base_url(&self) -> &str {
        self.process.base_url()
    }

    fn port(&self) -> String {
        self.base_url().rsplit(':').next().unwrap().to_string()
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_clean_error(output: &Output, needle: &str) {
    let text = stderr(output);
    assert!(!output.status.success(), "launch succeeded: {text}");
    assert!(!text.contains("panicked"), "panic: {text}");
    let last = text.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains(needle), "{needle:?} not in {text}");
}

#[test]
fn launch_starts_a_server_for_the_agent_and_stops_it_when_the_agent_exits() {
    pull_model();
    let agents = StandIns::new();
    let (output, seen) = agents.launch(
        &["claude", "--port", "0", "--model", MODEL, "--", "-p", "say hi"],
        &[("STAND_IN_EXIT", "7"), ("ANTHROPIC_API_KEY", "a-real-anthropic-key")],
    );
    let seen = seen.unwrap_or_else(|| panic!("the agent did not run: {}", stderr(&output)));
    // The agent's exit status is launch's.
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    assert_eq!(seen["status"], 200, "{seen}");
    assert_eq!(seen["args"], serde_json::json!(["-p", "say hi"]));
    let env = &seen["env"];
    assert_eq!(env["ANTHROPIC_MODEL"], MODEL);
    assert_eq!(env["ANTHROPIC_SMALL_FAST_MODEL"], MODEL);
    assert!(env.get("ANTHROPIC_API_KEY").is_none(), "the user's Anthropic key leaked: {env}");
    let cwd = std::fs::canonicalize(agents.work.path()).unwrap();
    assert_eq!(Path::new(seen["cwd"].as_str().unwrap()), cwd);
    assert!(stderr(&output).contains(&format!("serving {MODEL} at")), "{}", stderr(&output));
    // The server launch started is gone with it.
    let base_url = env["ANTHROPIC_BASE_URL"].as_str().unwrap();
    let address = base_url.trim_start_matches("http://");
    assert!(std::net::TcpStream::connect(address).is_err(), "{base_url} still answers");
}

#[test]
fn launch_wires_each_agent_to_a_running_server_and_leaves_it_running() {
    let server = Server::start(&["--api-key", "sesame"]);
    let agents = StandIns::new();
    let port = server.port();
    let cases: [(&str, &[&str]); 4] = [
        ("claude", &["-p", "say hi"]),
        ("codex", &["exec", "say hi"]),
        ("qwen", &["-p", "say hi"]),
        ("opencode", &["run", "say hi"]),
    ];
    for (agent, user_args) in cases {
        let mut args = vec![agent, "--port", &port, "--api-key", "sesame", "--"];
        args.extend_from_slice(user_args);
        let (output, seen) = agents.launch(&args, &[]);
        let seen = seen.unwrap_or_else(|| panic!("{agent} did not run: {}", stderr(&output)));
        assert!(output.status.success(), "{agent}: {}", stderr(&output));
        assert_eq!(seen["status"], 200, "{agent}: {seen}");
        assert!(seen["url"].as_str().unwrap().starts_with(server.base_url()), "{seen}");
        // The user's arguments come last, as given.
        let given: Vec<&str> =
            seen["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(given.ends_with(user_args), "{agent}: {given:?}");
        match agent {
            "codex" => assert!(given.contains(&r#"model_providers.spindle.wire_api="responses""#)),
            "qwen" => assert_eq!(&given[..2], ["--auth-type", "openai"]),
            _ => assert_eq!(given, user_args),
        }
    }
    // A started server would have been stopped; this one was the user's.
    let health = agents.launch(&["qwen", "--port", &port, "--api-key", "sesame"], &[]).1.unwrap();
    assert_eq!(health["status"], 200);

    let (output, _) =
        agents.launch(&["claude", "--port", &port, "--api-key", "sesame", "--model", "nope"], &[]);
    assert_clean_error(&output, &format!("does not serve `nope`; it serves: {MODEL}"));
    let (output, seen) = agents.launch(&["claude", "--port", &port], &[]);
    assert_clean_error(&output, "needs an API key: pass --api-key");
    assert!(seen.is_none(), "the agent ran without a key");
}

#[test]
fn an_agent_that_is_not_installed_is_named_with_its_npm_package() {
    let empty = tempfile::tempdir().unwrap();
    for (agent, package) in [
        ("claude", "@anthropic-ai/claude-code"),
        ("codex", "@openai/codex"),
        ("qwen", "@qwen-code/qwen-code"),
        ("opencode", "opencode-ai"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["launch", agent, "--port", "0"])
            .env("PATH", empty.path())
            .output()
            .unwrap();
        assert_clean_error(
            &output,
            &format!("is not installed: install it with `npm install -g {package}`"),
        );
    }
}

#[test]
fn a_model_that_cannot_be_served_stops_launch_with_the_reason() {
    let agents = StandIns::new();
    let (output, seen) =
        agents.launch(&["codex", "--port", "0", "--model", "/nonexistent/model.gguf"], &[]);
    assert_clean_error(&output, "stopped before it listened");
    assert!(stderr(&output).contains("/nonexistent/model.gguf"), "{}", stderr(&output));
    assert!(seen.is_none(), "the agent ran without a server");
}
