//! The server side of `spindle launch`: asking whether a Spindle server already answers at an
//! address (and which models it serves), and starting `spindle serve` as a child process that
//! lives as long as the launch, with a progress line while the model downloads and loads.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// What answers at an address.
pub enum Probe {
    /// Nothing listens there.
    Nothing,
    /// A server with these models.
    Serving(Vec<String>),
}

/// Asks `GET /v1/models` at `base_url`. Anything but a connection refused that is not a model
/// list (another program on the port, a key that does not open it) is an error saying so.
pub fn probe(base_url: &str, api_key: Option<&str>) -> anyhow::Result<Probe> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent.get(format!("{base_url}/v1/models"));
    if let Some(key) = api_key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    let response = match request.call() {
        Ok(response) => response,
        Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Ok(Probe::Nothing)
        }
        Err(ureq::Error::ConnectionFailed) => return Ok(Probe::Nothing),
        Err(e) => bail!("cannot ask {base_url} for its models: {e}"),
    };
    let status = response.status().as_u16();
    if status == 401 {
        let hint = if api_key.is_some() {
            "the key given is not its key"
        } else {
            "pass --api-key (or set SPINDLE_API_KEY)"
        };
        bail!("the server at {base_url} needs an API key: {hint}");
    }
    let body = response.into_body().read_to_string().unwrap_or_default();
    let models: Option<Vec<String>> =
        serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|list| {
            let data = list.get("data")?.as_array()?;
            data.iter().map(|card| Some(card.get("id")?.as_str()?.to_string())).collect()
        });
    match models {
        Some(models) if status == 200 => Ok(Probe::Serving(models)),
        _ => bail!("{base_url} answers, but not as an OpenAI-compatible server (HTTP {status} to /v1/models)"),
    }
}

/// `spindle serve` run by `launch`: stopped (with Ctrl+C's signal, so it shuts down cleanly)
/// when dropped. Its log goes to a file, out of the agent's terminal.
pub struct StartedServer {
    child: Child,
    pub base_url: String,
    pub log: PathBuf,
}

impl StartedServer {
    /// Starts a server for `model` and returns once it listens. Port 0 lets the system choose
    /// a port; the server's "listening on" line tells which.
    pub fn start(
        model: &str,
        host: &str,
        port: u16,
        api_key: Option<&str>,
    ) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!("spindle-launch-{}.log", std::process::id()));
        let mut log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create the server log {}", log.display()))?;
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["serve", "--model", model, "--host", host, "--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1");
        match api_key {
            Some(key) => command.env("SPINDLE_API_KEY", key),
            None => command.env_remove("SPINDLE_API_KEY"),
        };
        detach_from_terminal(&mut command);
        let mut child = command.spawn().context("cannot start `spindle serve`")?;
        let stderr = child.stderr.take().context("no stderr from `spindle serve`")?;

        // A thread copies the server's log to the file for as long as it runs, and hands the
        // lines to this one until the server listens.
        let (lines, received) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(log_file, "{line}");
                let _ = lines.send(line);
            }
        });
        let mut server = Self { child, base_url: String::new(), log };
        let progress = Progress::new(model);
        let mut last = String::new();
        for line in received.iter() {
            if let Some(address) = line.split("listening on ").nth(1) {
                let log = server.log.display();
                progress.finish(&format!("serving {model} at {} (log: {log})", address.trim()));
                server.base_url = address.trim().to_string();
                return Ok(server);
            }
            progress.show(&line);
            last = line;
        }
        progress.finish("");
        let status = server.child.wait()?;
        let reason = last.trim_start_matches("error: ");
        bail!("`spindle serve --model {model}` stopped before it listened ({status}): {reason} (log: {})", server.log.display())
    }
}

impl Drop for StartedServer {
    fn drop(&mut self) {
        // SAFETY: signals our own child, whose pid is ours to use until it is waited for.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        // A guard, not a pace: a clean stop takes well under a second.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Puts the server in a process group of its own, so the terminal's Ctrl+C reaches the agent
/// but not the server, and has Linux stop it if `launch` itself is killed.
fn detach_from_terminal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    command.process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with integer arguments is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

/// One line on the terminal that the server's latest log line overwrites while it loads.
struct Progress {
    model: String,
    started: Instant,
    terminal: bool,
}

impl Progress {
    fn new(model: &str) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let progress = Self { model: model.to_string(), started: Instant::now(), terminal };
        progress.show("starting spindle serve");
        progress
    }

    fn show(&self, line: &str) {
        let seconds = self.started.elapsed().as_secs();
        let text =
            format!("spindle: loading {} ({seconds}s) {}", self.model, strip_log_prefix(line));
        if self.terminal {
            let width = 100;
            let shown: String = text.chars().take(width).collect();
            eprint!("\r\x1b[2K{shown}");
        } else {
            eprintln!("{text}");
        }
    }

    fn finish(&self, message: &str) {
        if self.terminal {
            eprint!("\r\x1b[2K");
        }
        if !message.is_empty() {
            eprintln!("spindle: {message}");
        }
    }
}

/// A tracing line without its timestamp and level, which say nothing in a progress line.
fn strip_log_prefix(line: &str) -> &str {
    ["INFO ", "WARN "]
        .iter()
        .find_map(|level| line.split_once(level).map(|(_, rest)| rest.trim()))
        .unwrap_or(line)
}
