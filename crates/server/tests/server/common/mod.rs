//! A real server on a loopback port, one per configuration, shared by the tests of a binary.
//! Most run the whole engine on a tiny random-weight model that the tests write themselves
//! (Qwen3's tokenizer and template: thinking and Hermes tool calls), so they need no download;
//! a handful run a real model (SmolLM2-135M-Instruct or Qwen2.5-Coder-0.5B, pulled into
//! `$SPINDLE_HOME` on first use) where a real model's answers are the point. The routes' shapes,
//! errors and streaming are tested in-process around a scripted engine (`tests/routes`).

#[path = "../../shared/chat_stream.rs"]
mod chat_stream;
pub use chat_stream::{parse_chat_stream, sse_data};

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};
use spindle_server::ServerConfig;

/// ChatML with the assistant turn opened inside a `<think>` block, as Qwen3.5's template does
/// (Qwen3's leaves the model to open it, which a random model never does).
pub const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// The id the tiny random model is served under.
pub const TINY: &str = "tiny-random";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Setup {
    /// The tiny model behind plain ChatML.
    Default,
    /// The tiny model behind [`THINKING_TEMPLATE`], thinking by default.
    Thinking,
    /// [`Setup::Thinking`] behind `--no-thinking`.
    NoThinking,
    /// The tiny model behind Qwen3's template (Hermes tool calls), 16 requests at once, 64
    /// waiting, 1 MiB bodies.
    Wide,
    /// `--guided-json` [`GUIDED_SCHEMA`]: every answer without `response_format` follows it.
    GuidedJson,
    /// The real default model, SmolLM2-135M-Instruct.
    Smol,
    /// The real Qwen2.5-Coder-0.5B-Instruct (Hermes tool calls), limits as [`Setup::Wide`].
    Qwen,
}

impl Setup {
    /// The id the server serves, which answers carry as `model`.
    pub fn model(self) -> &'static str {
        match self {
            Setup::Smol => "smollm2-135m",
            Setup::Qwen => "qwen2.5-coder-0.5b",
            _ => TINY,
        }
    }
}

/// The server-wide schema of [`Setup::GuidedJson`].
pub fn guided_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 40}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": false,
    })
}

/// The base URL of a running server for `setup`, started on first use.
pub fn server(setup: Setup) -> String {
    static SERVERS: OnceLock<Mutex<HashMap<Setup, String>>> = OnceLock::new();
    let mut servers =
        SERVERS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    servers.entry(setup).or_insert_with(|| start(setup)).clone()
}

fn start(setup: Setup) -> String {
    start_with(setup, |_| {})
}

/// A new server for `setup`, with its configuration changed by `change` (its batch folder is a
/// fresh one unless `change` names another).
pub fn start_with(setup: Setup, change: impl FnOnce(&mut ServerConfig)) -> String {
    start_stoppable(setup, change).url
}

/// A server that can be stopped; dropping the handle leaves it running.
pub struct StoppableServer {
    pub url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl StoppableServer {
    /// Shuts the server down and returns once its tasks and engine are gone.
    pub fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}

/// [`start_with`], keeping the means to stop the server.
pub fn start_stoppable(setup: Setup, change: impl FnOnce(&mut ServerConfig)) -> StoppableServer {
    let model = setup.model();
    let files = match setup {
        Setup::Smol | Setup::Qwen => spindle_hub::resolve(
            model,
            &spindle_hub::spindle_home(),
            spindle_hub::WhenMissing::Download,
        )
        .expect("pull the test model"),
        _ => spindle_testkit::tiny_model(),
    };
    let mut bundle = spindle_runner::ModelBundle::load(&files).expect("load the test model");
    let mut config = ServerConfig {
        model_id: model.into(),
        api_key: None,
        max_concurrent: 4,
        max_queue: 16,
        ctx_size: 2048,
        thinking_default: false,
        thinking_budget: None,
        chat_template_kwargs: Default::default(),
        max_body_bytes: 64 * 1024,
        cache: Default::default(),
        tool_call_parser: None,
        guided_json: None,
        keep_alive: std::time::Duration::from_secs(15),
        orphan_prefill_tokens: usize::MAX,
        batch: spindle_server::BatchConfig::new(fresh_dir("batches")),
        speculation: Default::default(),
        sampling: Default::default(),
        shutdown_grace: std::time::Duration::from_secs(30),
    };
    match setup {
        Setup::Default | Setup::GuidedJson => {
            bundle.template = spindle_chat::ChatTemplate::chatml()
        }
        Setup::Smol => {}
        Setup::Thinking | Setup::NoThinking => {
            bundle.template =
                spindle_chat::ChatTemplate::new(THINKING_TEMPLATE, None, Some("<|im_end|>"))
                    .unwrap();
            config.thinking_default = setup == Setup::Thinking;
        }
        Setup::Wide | Setup::Qwen => {
            (config.max_concurrent, config.max_queue, config.max_body_bytes) = (16, 64, 1024 * 1024)
        }
    }
    if setup == Setup::GuidedJson {
        config.guided_json = Some(guided_schema());
    }
    change(&mut config);
    let state = spindle_server::start(config, bundle).expect("start the server");
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(format!("http://{}", listener.local_addr().unwrap())).unwrap();
            let shutdown = async {
                // A dropped handle is no request to stop.
                if stopped.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            spindle_server::serve(listener, state, shutdown).await.unwrap();
        });
    });
    StoppableServer { url: rx.recv().unwrap(), stop, thread }
}

/// A folder path of its own under the system's temporary folder, not created yet (the batch
/// store creates its folder on first use, so servers that run no batch leave nothing behind).
pub fn fresh_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "spindle-test-{name}-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ))
}

/// Generous: a burst of requests waits its turn behind the other tests' requests on 2 cores.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(std::time::Duration::from_secs(600)).build().unwrap()
}

/// A greedy chat request for one user message to the tiny model.
pub fn chat_body(user: &str, max_tokens: u32) -> Value {
    json!({
        "model": TINY,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = client().post(format!("{base}{path}")).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// The `data:` payloads of a server-sent-event response, `[DONE]` included.
pub async fn post_stream(base: &str, path: &str, body: &Value) -> Vec<String> {
    let response = client().post(format!("{base}{path}")).json(body).send().await.unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    sse_data(&response.text().await.unwrap())
}

/// Runs `tests/python/{script}` with `python`, given `args`, and fails with its output unless
/// it succeeds.
pub fn run_python_script(python: &std::path::Path, script: &str, args: &[String]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(script);
    let output = std::process::Command::new(python)
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // What the script measured, for `--nocapture`.
    print!("{}", String::from_utf8_lossy(&output.stdout));
}

/// The Python interpreter of `$SPINDLE_HOME/venv-openai` (where `.ci/run` installs the official
/// clients), once it can run `check` (e.g. `import anthropic`); `requirement` is installed into it
/// first when it cannot (the venv made first if missing).
pub fn python_with(check: &str, requirement: &str) -> std::path::PathBuf {
    use std::process::Command;
    let venv = spindle_hub::spindle_home().join("venv-openai");
    let python = venv.join("bin/python");
    let ready =
        Command::new(&python).args(["-c", check]).output().is_ok_and(|o| o.status.success());
    if !ready {
        if !python.exists() {
            let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status();
            assert!(made.is_ok_and(|s| s.success()), "making the venv {} failed", venv.display());
        }
        let install = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--upgrade", requirement])
            .status();
        assert!(install.is_ok_and(|s| s.success()), "installing {requirement} failed");
    }
    python
}
