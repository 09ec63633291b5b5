//! What the browser test stands on: Chromium and chromedriver found on `PATH` (or the test
//! skipped, only outside CI, when they are missing), chromedriver started on a port it picks
//! itself, and the server in-process on a loopback port with the real SmolLM2 behind an engine
//! that records each request it receives.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use fantoccini::{Client, ClientBuilder};
use serde_json::json;
use spindle_runner::{
    Caller, Engine, EngineConfig, EngineHealth, EngineLoad, EngineStopped, SequenceRequest,
};
use spindle_server::{GenerationEngine, ServedModel, ServerConfig};

/// Chromium and its driver, as Debian's `chromium` and `chromium-driver` install them.
pub struct BrowserPrograms {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// The browser, or `None` (with the reason printed) when it is missing outside CI. In CI a
/// missing browser fails the test: there, a skipped browser test would hide a broken page.
pub fn browser_or_skip() -> Option<BrowserPrograms> {
    let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"]);
    let chromedriver = on_path(&["chromedriver"]);
    if let (Some(chromium), Some(chromedriver)) = (chromium, chromedriver) {
        return Some(BrowserPrograms { chromium, chromedriver });
    }
    let missing = "chromium and chromedriver (Debian packages `chromium` and `chromium-driver`)";
    if std::env::var_os("CI").is_some() {
        panic!("CI is set, and the browser test needs {missing}: .ci/run installs them");
    }
    eprintln!("SKIPPED the browser test: it needs {missing}, and CI is unset");
    None
}

/// chromedriver, on the port it chose, killed when dropped.
pub struct Driver {
    child: Child,
    pub url: String,
}

impl Driver {
    pub fn start(programs: &BrowserPrograms) -> Self {
        let mut child = Command::new(&programs.chromedriver)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                let rest = l.split("started successfully on port ").nth(1)?;
                Some(rest.trim_end_matches('.').trim().to_string())
            })
            .expect("chromedriver's 'started successfully on port' line");
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url: format!("http://127.0.0.1:{port}") }
    }

    /// A headless Chromium session of `width`×`height` pixels.
    pub async fn session(&self, programs: &BrowserPrograms, width: u32, height: u32) -> Client {
        let options = json!({
            "binary": programs.chromium,
            // Root in a container has no sandbox to drop into; /dev/shm there is small.
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     format!("--window-size={width},{height}"), "--lang=en-US"],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("a Chromium session from chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the engine was asked for, per request.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    pub temperature: f32,
    pub seed: Option<u64>,
    pub max_tokens: usize,
}

/// The model's engine, noting each request as the server hands it over.
pub struct RecordingEngine {
    engine: Engine,
    pub received: Mutex<Vec<Received>>,
}

impl GenerationEngine for RecordingEngine {
    fn submit(&self, request: SequenceRequest, caller: Caller) -> Result<(), EngineStopped> {
        self.received.lock().unwrap().push(Received {
            temperature: request.sampling.temperature,
            seed: request.sampling.seed,
            max_tokens: request.max_tokens,
        });
        self.engine.submit(request, caller)
    }

    fn load(&self) -> &EngineLoad {
        self.engine.load()
    }

    fn health(&self) -> EngineHealth {
        self.engine.health()
    }
}

/// The served model's name and context.
pub const MODEL: &str = "smollm2-135m";
pub const CONTEXT: usize = 2048;

/// Serves SmolLM2 on a loopback port of the system's choosing, from this test's runtime,
/// requiring `api_key` if given. Returns the page's URL and the recording engine.
pub async fn start_server(api_key: Option<&str>) -> (String, Arc<RecordingEngine>) {
    let files = spindle_hub::resolve(
        MODEL,
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )
    .expect("pull the test model");
    let bundle = spindle_runner::ModelBundle::load(&files).expect("load the test model");
    let batch_dir = std::env::temp_dir().join(format!(
        "spindle-browser-batches-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let config = ServerConfig {
        model_id: MODEL.into(),
        api_key: api_key.map(str::to_string),
        max_concurrent: 4,
        max_queue: 16,
        ctx_size: CONTEXT,
        thinking_default: true,
        thinking_budget: None,
        chat_template_kwargs: Default::default(),
        max_body_bytes: 1024 * 1024,
        cache: Default::default(),
        tool_call_parser: None,
        guided_json: None,
        keep_alive: std::time::Duration::from_secs(15),
        orphan_prefill_tokens: 0,
        batch: spindle_server::BatchConfig::new(batch_dir),
        speculation: Default::default(),
        sampling: Default::default(),
        shutdown_grace: std::time::Duration::from_secs(30),
    };
    let model = ServedModel::of(&bundle, &config.cache);
    let engine_config = EngineConfig::new(config.max_concurrent, config.cache.clone());
    let engine = Arc::new(RecordingEngine {
        engine: Engine::start(Arc::new(bundle), engine_config),
        received: Mutex::new(Vec::new()),
    });
    let state = spindle_server::start_with_engine(config, model, engine.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(spindle_server::serve(listener, state, std::future::pending()));
    (url, engine)
}
