//! The server a `spindle bench` panel measures when no `--base-url` is given: `spindle serve`
//! started as a child process on a free local port, its output in a log file, restarted for the
//! cold-prefix phase and stopped at the end. With `--restart-cmd`, the caller's command restarts
//! a server the benchmark did not start.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::Client;

/// How long a started server may take to load its model and answer `/health`.
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a started server gets to shut down after SIGINT before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// What the started `spindle serve` runs.
pub struct ServeOptions<'a> {
    /// Catalogue name, .gguf file or folder, already on disk ([`super::ModelResolver`]).
    pub model: String,
    pub threads: Option<usize>,
    /// Extra `serve` arguments, each split at spaces.
    pub extra: &'a [String],
    /// Requests the queue must hold (the biggest burst).
    pub max_queue: usize,
}

/// A `spindle serve` child process on a free local port, its output in a log file.
pub struct ServerProcess {
    port: u16,
    args: Vec<String>,
    log: PathBuf,
    /// The disk tier folder made for this run, removed at the end.
    cache_dir: Option<PathBuf>,
    child: Option<Child>,
    /// The running child's process id (0: none), shared with the footprint probe.
    pid: Arc<AtomicU32>,
}

impl ServerProcess {
    /// Prepares the command line; nothing is started yet.
    pub fn new(options: &ServeOptions) -> anyhow::Result<Self> {
        let model = &options.model;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut serve: Vec<String> =
            ["serve", "--model", model, "--host", "127.0.0.1", "--port", &port.to_string()]
                .map(String::from)
                .into();
        if let Some(threads) = options.threads {
            serve.extend(["--threads".to_string(), threads.to_string()]);
        }
        let extra: Vec<String> =
            options.extra.iter().flat_map(|a| a.split_whitespace()).map(String::from).collect();
        // The biggest burst must fit the queue; a --max-queue of the caller's wins.
        if !extra.iter().any(|a| a == "--max-queue" || a.starts_with("--max-queue=")) {
            serve.extend(["--max-queue".to_string(), options.max_queue.max(64).to_string()]);
        }
        // The cold-prefix phase is there to measure the disk tier: a started server gets one in
        // a fresh folder unless the caller names its own.
        let cache_dir = (!extra.iter().any(|a| a.starts_with("--prefix-cache-dir")))
            .then(|| std::env::temp_dir().join(format!("spindle-bench-{port}-cache")));
        if let Some(dir) = &cache_dir {
            serve.extend(["--prefix-cache-dir".to_string(), dir.display().to_string()]);
        }
        serve.extend(extra);
        let log = std::env::temp_dir().join(format!("spindle-bench-{port}.log"));
        Ok(Self { port, args: serve, log, cache_dir, child: None, pid: Arc::default() })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The running child's process id, updated across restarts (0 while none runs).
    pub fn pid(&self) -> Arc<AtomicU32> {
        self.pid.clone()
    }

    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let exe = std::env::current_exe().context("cannot find the spindle executable")?;
        eprintln!(
            "starting {} {} (log: {})",
            exe.display(),
            self.args.join(" "),
            self.log.display()
        );
        let child = Command::new(exe)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start spindle serve")?;
        self.pid.store(child.id(), Ordering::Relaxed);
        self.child = Some(child);
        Ok(())
    }

    /// Waits for `/health`; fails with the end of the log if the server exits first.
    pub async fn wait_ready(&mut self, client: &Client) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) =
                self.child.as_mut().and_then(|c| c.try_wait().transpose()).transpose()?
            {
                anyhow::bail!(
                    "spindle serve exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if client.is_ready().await {
                eprintln!("server ready after {:.1} s", start.elapsed().as_secs_f64());
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < READY_TIMEOUT,
                "spindle serve not ready after {READY_TIMEOUT:?}:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn restart(&mut self, client: &Client) -> anyhow::Result<()> {
        self.stop();
        self.start()?;
        self.wait_ready(client).await
    }

    /// SIGINT (a graceful shutdown, as Ctrl-C), then SIGKILL if it lingers.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        self.pid.store(0, Ordering::Relaxed);
        let interrupted = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let start = Instant::now();
        while interrupted && start.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.cache_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs the caller's `--restart-cmd` through `sh -c` and waits for the server to answer again.
pub async fn run_restart_command(command: &str, client: &Client) -> anyhow::Result<()> {
    eprintln!("restarting the server: {command}");
    // Nothing else runs meanwhile, so the blocking wait holds up no other task.
    let status = Command::new("sh").args(["-c", command]).status()?;
    anyhow::ensure!(status.success(), "--restart-cmd failed ({status})");
    // The old process may still answer for a moment; give it time to go away.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.wait_ready(READY_TIMEOUT).await?;
    Ok(())
}
