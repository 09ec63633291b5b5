//! `spindle serve` as a child process: the one implementation behind `spindle launch` (a server
//! for the agent) and `spindle bench` / `spindle eval` (the server measured). The child gets a
//! process group of its own and, on Linux, dies with its parent; its output goes to a log file;
//! a progress line shows its latest log line until it says where it listens; it is stopped with
//! SIGINT (a clean shutdown, as Ctrl+C) and killed if it lingers.
//!
//! The child is started with `--port 0` unless the caller names a port, and the address comes
//! from the `listening on http://ADDRESS` line `spindle serve` prints once it has loaded its
//! model and bound: no port is chosen here and freed for the child to take, which another
//! process could take first.

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long a server gets to shut down after SIGINT before it is killed. A guard, not a pace:
/// a clean stop takes well under a second.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start `spindle serve`.
pub struct ServeCommand {
    /// The `spindle` executable (this one, for the commands that start a server).
    pub program: PathBuf,
    /// What `--model` names: catalogue name, .gguf file or folder; the progress line shows it.
    pub model: String,
    pub host: String,
    /// 0: the system picks a free port when the server binds.
    pub port: u16,
    /// Further `serve` arguments.
    pub args: Vec<String>,
    /// The key the server requires, handed over in its environment; None: it requires none,
    /// whatever `SPINDLE_API_KEY` this process has.
    pub api_key: Option<String>,
    /// Where the server's output goes, made anew at the first start and appended to after.
    pub log: PathBuf,
    /// How long the server may take to listen; None: as long as it takes (a model it downloads).
    pub ready_timeout: Option<Duration>,
    /// A folder made for this server alone (a disk tier), removed when it is dropped.
    pub scratch_dir: Option<PathBuf>,
}

/// A running `spindle serve` child; stopped when dropped.
pub struct ServerProcess {
    command: ServeCommand,
    child: Option<Child>,
    /// `http://ADDRESS` from the server's listening line.
    base_url: String,
    /// The running child's process id (0: none), shared with the bench's footprint probe.
    pid: Arc<AtomicU32>,
}

impl ServerProcess {
    /// Starts the server and returns once it listens, or fails with the last line of its log
    /// (the reason, as a rule) if it exits or times out first.
    pub fn start(command: ServeCommand) -> anyhow::Result<Self> {
        let mut server =
            Self { command, child: None, base_url: String::new(), pid: Arc::default() };
        let port = server.command.port;
        server.spawn_and_wait(port, LogStart::Fresh)?;
        Ok(server)
    }

    /// `http://ADDRESS`, where the server listens.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The running child's process id, updated across restarts (0 while none runs).
    pub fn pid(&self) -> Arc<AtomicU32> {
        self.pid.clone()
    }

    /// Stops the server and starts it again on the same port: clients hold its address, so a
    /// new port would lose them. The port was this child's until it stopped; another process
    /// could take it in between, and then the restart fails with the server's own "cannot
    /// listen" error.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let port = port_of(&self.base_url)?;
        self.stop();
        self.spawn_and_wait(port, LogStart::Append)
    }

    /// SIGINT (a graceful shutdown, as Ctrl+C), then SIGKILL if it lingers.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        self.pid.store(0, Ordering::Relaxed);
        let Ok(pid) = libc::pid_t::try_from(child.id()) else {
            let _ = child.kill();
            let _ = child.wait();
            return;
        };
        // SAFETY: signals our own child, whose pid is ours to use until it is waited for.
        let interrupted = unsafe { libc::kill(pid, libc::SIGINT) } == 0;
        let deadline = Instant::now() + STOP_TIMEOUT;
        while interrupted && Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn spawn_and_wait(&mut self, port: u16, log_start: LogStart) -> anyhow::Result<()> {
        let lines = self.spawn(port, log_start)?;
        let progress = Progress::new(&self.command.model);
        let waited = wait_for_address(&lines, &progress, self.command.ready_timeout);
        progress.finish();
        let model = self.command.model.clone();
        let log = self.command.log.display().to_string();
        let last = match waited {
            Waited::Listening(address) => {
                self.base_url = format!("http://{address}");
                let seconds = progress.started.elapsed().as_secs_f64();
                eprintln!(
                    "spindle: serving {model} at {} after {seconds:.1} s (log: {log})",
                    self.base_url
                );
                return Ok(());
            }
            Waited::TimedOut { last } => {
                self.stop();
                let timeout = self.command.ready_timeout.unwrap_or_default();
                bail!(
                    "`spindle serve --model {model}` did not listen within {timeout:?}; its log \
                     ends: {last} (log: {log})"
                );
            }
            Waited::Ended { last } => last,
        };
        // The output ended: the server has exited, or is about to.
        let status = match self.child.take() {
            Some(mut child) => child.wait()?.to_string(),
            None => "gone".to_string(),
        };
        self.pid.store(0, Ordering::Relaxed);
        let reason = last.trim_start_matches("error: ");
        bail!(
            "`spindle serve --model {model}` stopped before it listened ({status}): {reason} \
             (log: {log})"
        )
    }

    /// Starts the child on `port`; the lines it writes on standard error arrive on the receiver
    /// until it exits.
    fn spawn(&mut self, port: u16, log_start: LogStart) -> anyhow::Result<mpsc::Receiver<String>> {
        let command = &self.command;
        let mut log = log_start
            .open(&command.log)
            .with_context(|| format!("cannot open the server log {}", command.log.display()))?;
        let mut serve = Command::new(&command.program);
        serve
            .args(["serve", "--model", &command.model, "--host", &command.host])
            .args(["--port", &port.to_string()])
            .args(&command.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1");
        match &command.api_key {
            Some(key) => serve.env("SPINDLE_API_KEY", key),
            None => serve.env_remove("SPINDLE_API_KEY"),
        };
        detach_from_terminal(&mut serve);
        let mut child = serve.spawn().context("cannot start `spindle serve`")?;
        let stderr = child.stderr.take().context("no stderr from `spindle serve`")?;
        self.pid.store(child.id(), Ordering::Relaxed);
        self.child = Some(child);

        // A thread copies the server's output to the log for as long as it runs, and hands the
        // lines on, to a receiver that listens until the server does.
        let (lines, received) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                let _ = lines.send(line);
            }
        });
        Ok(received)
    }
}

/// How the wait for the listening line ended; `last` is the last log line seen before.
enum Waited {
    Listening(String),
    /// The server's output ended: it exited.
    Ended {
        last: String,
    },
    TimedOut {
        last: String,
    },
}

/// Shows the server's log lines until one says where it listens, its output ends, or `timeout`
/// (None: no limit) passes.
fn wait_for_address(
    received: &mpsc::Receiver<String>,
    progress: &Progress,
    timeout: Option<Duration>,
) -> Waited {
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let mut last = String::new();
    loop {
        let line = match deadline {
            None => received.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(deadline) => {
                received.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            }
        };
        let line = match line {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Waited::Ended { last },
            Err(mpsc::RecvTimeoutError::Timeout) => return Waited::TimedOut { last },
        };
        if let Some(address) = listening_address(&line) {
            return Waited::Listening(address.to_string());
        }
        progress.show(&line);
        last = line;
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = &self.command.scratch_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Whether a start makes the log anew (the first) or adds to it (a restart, whose log follows
/// the first run's).
#[derive(Clone, Copy)]
enum LogStart {
    Fresh,
    Append,
}

impl LogStart {
    fn open(self, path: &Path) -> std::io::Result<File> {
        match self {
            LogStart::Fresh => File::create(path),
            LogStart::Append => std::fs::OpenOptions::new().create(true).append(true).open(path),
        }
    }
}

/// `ADDRESS` in `spindle serve`'s `listening on http://ADDRESS` line, as text or inside a JSON
/// log line (`--log-format json`), where a quote ends it.
fn listening_address(line: &str) -> Option<&str> {
    let (_, rest) = line.split_once("listening on http://")?;
    let end = rest.find(|c: char| c.is_whitespace() || c == '"').unwrap_or(rest.len());
    Some(&rest[..end]).filter(|address| !address.is_empty())
}

/// The port of `http://HOST:PORT`.
fn port_of(base_url: &str) -> anyhow::Result<u16> {
    base_url
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .with_context(|| format!("the server's address {base_url} names no port"))
}

/// Puts the server in a process group of its own, so the terminal's Ctrl+C reaches the agent
/// (or the bench) but not the server, and has Linux stop it if this process dies without
/// stopping it. Linux sends that signal when the *thread* that started the child ends, so a
/// server must be started from a thread that lives as long as it should (the main thread).
/// SIGINT, which [`ServerProcess::stop`] sends, is set back to its default: a process started as
/// a shell's background job inherits it ignored, and a server without a handler of its own would
/// then linger until killed.
fn detach_from_terminal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    command.process_group(0);
    #[cfg(target_os = "linux")]
    let parent = std::process::id();
    // SAFETY: sigaction, prctl and getppid are async-signal-safe, as pre_exec requires, and the
    // error is built from a number, without allocating.
    unsafe {
        command.pre_exec(move || {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGINT, &default, std::ptr::null_mut());
            #[cfg(target_os = "linux")]
            {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                // A parent that died before the signal was asked for would never send it.
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        });
    }
}

/// One line on the terminal that the server's latest log line overwrites while it loads (one
/// line each when standard error is not a terminal).
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

    /// Clears the line, for what is printed next.
    fn finish(&self) {
        if self.terminal {
            eprint!("\r\x1b[2K");
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `spindle`: a shell script that records its arguments, prints `lines` on
    /// standard error, and then runs `then` (it never binds a port).
    fn stand_in(dir: &Path, lines: &str, then: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("spindle");
        let script = format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\nprintf '{lines}' >&2\n{then}\n",
            dir.join("args").display()
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn command(dir: &Path, program: PathBuf) -> ServeCommand {
        ServeCommand {
            program,
            model: "tiny".into(),
            host: "127.0.0.1".into(),
            port: 0,
            args: vec!["--threads".into(), "1".into()],
            api_key: None,
            log: dir.join("serve.log"),
            ready_timeout: None,
            scratch_dir: None,
        }
    }

    #[test]
    fn the_address_comes_from_the_listening_line_and_a_restart_keeps_its_port() {
        let dir = tempfile::tempdir().unwrap();
        let program = stand_in(
            dir.path(),
            "INFO loading\\nlistening on http://127.0.0.1:4321\\n",
            "exec sleep 600",
        );
        let mut server = ServerProcess::start(command(dir.path(), program)).unwrap();
        assert_eq!(server.base_url(), "http://127.0.0.1:4321");
        assert_ne!(server.pid().load(Ordering::Relaxed), 0);
        server.restart().unwrap();
        server.stop();
        assert_eq!(server.pid().load(Ordering::Relaxed), 0);
        let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
        let lines: Vec<&str> = args.lines().collect();
        assert_eq!(
            lines,
            [
                "serve --model tiny --host 127.0.0.1 --port 0 --threads 1",
                "serve --model tiny --host 127.0.0.1 --port 4321 --threads 1",
            ]
        );
        // Both runs' output is in the log.
        let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
        assert_eq!(log.matches("listening on").count(), 2, "{log}");
    }

    /// Started from a process that ignores SIGINT (as a shell's background job does), the
    /// server still has SIGINT's default action, so `stop` ends it at once. The stand-in reads
    /// its ignored signals from /proc (bit 1 is SIGINT).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_server_started_by_a_process_ignoring_sigint_does_not_ignore_it() {
        let dir = tempfile::tempdir().unwrap();
        // The disposition is read before the listening line, which `start` waits for.
        let ignored = dir.path().join("ignored");
        let listen = "printf 'listening on http://127.0.0.1:4321\\n' >&2\nexec sleep 600";
        let then = format!("grep SigIgn /proc/$$/status > '{}'\n{listen}", ignored.display());
        let program = stand_in(dir.path(), "", &then);
        // SAFETY: sets and then restores this process's SIGINT disposition; children started
        // meanwhile by other tests inherit it, which this module's own fix undoes for servers.
        let previous = unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        let started = ServerProcess::start(command(dir.path(), program));
        // SAFETY: as above.
        unsafe { libc::signal(libc::SIGINT, previous) };
        let mut server = started.unwrap();
        server.stop();
        let ignored = std::fs::read_to_string(ignored).unwrap();
        let mask = u64::from_str_radix(ignored.trim().trim_start_matches("SigIgn:").trim(), 16)
            .unwrap_or_else(|e| panic!("{ignored}: {e}"));
        assert_eq!(mask & 0b10, 0, "SIGINT ignored by the server: {ignored}");
    }

    #[test]
    fn a_server_that_exits_before_it_listens_is_an_error_with_its_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let program = stand_in(dir.path(), "INFO loading\\nerror: no such model\\n", "exit 3");
        let error = ServerProcess::start(command(dir.path(), program)).err().unwrap().to_string();
        assert!(error.contains("stopped before it listened"), "{error}");
        assert!(error.contains("exit status: 3): no such model (log: "), "{error}");
    }

    #[test]
    fn a_server_that_does_not_listen_in_time_is_stopped_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        // Silent and alive until stopped: only the timeout can end the wait.
        let program = stand_in(dir.path(), "", "exec sleep 600");
        let command =
            ServeCommand { ready_timeout: Some(Duration::ZERO), ..command(dir.path(), program) };
        let error = ServerProcess::start(command).err().unwrap().to_string();
        assert!(error.contains("did not listen within 0ns"), "{error}");
    }

    #[test]
    fn the_listening_address_is_read_from_text_and_json_lines() {
        assert_eq!(listening_address("listening on http://127.0.0.1:8080"), Some("127.0.0.1:8080"));
        let json = r#"{"fields":{"message":"listening on http://[::1]:9"},"target":"x"}"#;
        assert_eq!(listening_address(json), Some("[::1]:9"));
        assert_eq!(listening_address("listening on http://"), None);
        assert_eq!(listening_address("INFO loading"), None);
        assert_eq!(port_of("http://[::1]:9").unwrap(), 9);
        assert!(port_of("http://host").is_err());
    }
}
