//! `spindle launch AGENT`: runs a coding agent (Claude Code, Codex, Qwen Code, OpenCode) against
//! a Spindle server in one command. It uses the server already listening on `--host`/`--port`,
//! or starts `spindle serve` for the model as a child process and stops it when the agent exits;
//! it hands the agent the server's address, key and model the way that agent reads them (its
//! environment, or Codex's `-c` overrides: no file of the user's is written), runs it in the
//! current folder on the user's terminal, and exits with the agent's status.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use spindle_bench::cli::running_server::{models_at, AtAddress};
use spindle_bench::cli::server_process::{ServeCommand, ServerProcess};
use spindle_bench::SESSION_HEADER;

#[derive(Args)]
pub struct LaunchArgs {
    /// The agent to run.
    agent: Agent,
    /// The model the agent uses. A running server must serve it; otherwise a server is started
    /// for it (catalogue name, .gguf file or folder, as `spindle serve --model`). Default: the
    /// running server's model, else the default model.
    #[arg(long)]
    model: Option<String>,
    /// Where a server is looked for, or started.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The server's port; 0 always starts a new server, on a port the system picks.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The server's API key (a started server requires it too).
    #[arg(long, env = "SPINDLE_API_KEY")]
    api_key: Option<String>,
    /// Arguments passed on to the agent, after `--`.
    #[arg(last = true)]
    agent_args: Vec<String>,
}

/// The agents `launch` knows how to wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Agent {
    /// Claude Code (Anthropic Messages API).
    Claude,
    /// OpenAI's Codex CLI (Responses API).
    Codex,
    /// Qwen Code (Chat Completions).
    Qwen,
    /// OpenCode (Chat Completions).
    Opencode,
}

impl Agent {
    fn program(self) -> &'static str {
        match self {
            Agent::Claude => "claude",
            Agent::Codex => "codex",
            Agent::Qwen => "qwen",
            Agent::Opencode => "opencode",
        }
    }

    fn product(self) -> &'static str {
        match self {
            Agent::Claude => "Claude Code",
            Agent::Codex => "Codex",
            Agent::Qwen => "Qwen Code",
            Agent::Opencode => "OpenCode",
        }
    }

    fn npm_package(self) -> &'static str {
        match self {
            Agent::Claude => "@anthropic-ai/claude-code",
            Agent::Codex => "@openai/codex",
            Agent::Qwen => "@qwen-code/qwen-code",
            Agent::Opencode => "opencode-ai",
        }
    }
}

/// The server as the agent is told of it.
pub struct Endpoint {
    /// `http://host:port`, without the `/v1`.
    pub base_url: String,
    /// The server's key, or a placeholder: the agents refuse to start without one.
    pub api_key: String,
    pub model: String,
}

/// What the agent's process gets besides the user's arguments.
#[derive(Debug, Default, PartialEq)]
pub struct Wiring {
    pub set: Vec<(&'static str, String)>,
    pub remove: Vec<&'static str>,
    /// Placed before the user's arguments.
    pub args: Vec<String>,
}

/// The session id this run's agent sends (as `X-Session-ID`, where the agent can be told to),
/// so that vllm-router's `consistent_hash` keeps the whole session on one replica.
fn session_id() -> String {
    format!("spindle-launch-{}", std::process::id())
}

/// Any key does for a server started without `--api-key`; the agents only need one to exist.
const PLACEHOLDER_KEY: &str = "spindle";

pub fn wiring(agent: Agent, endpoint: &Endpoint) -> Wiring {
    let Endpoint { base_url, api_key, model } = endpoint;
    let v1 = format!("{base_url}/v1");
    match agent {
        // The auth token goes out as `Authorization: Bearer`; a real Anthropic key the user has
        // set must not be sent to this server, nor make Claude Code ask which key to use.
        Agent::Claude => Wiring {
            set: vec![
                ("ANTHROPIC_BASE_URL", base_url.clone()),
                ("ANTHROPIC_AUTH_TOKEN", api_key.clone()),
                ("ANTHROPIC_MODEL", model.clone()),
                ("ANTHROPIC_SMALL_FAST_MODEL", model.clone()),
                ("ANTHROPIC_DEFAULT_HAIKU_MODEL", model.clone()),
                // Behind a router, the session stays on the replica holding its cache.
                ("ANTHROPIC_CUSTOM_HEADERS", format!("{SESSION_HEADER}: {}", session_id())),
            ],
            remove: vec!["ANTHROPIC_API_KEY"],
            args: vec![],
        },
        // `-c` overrides the user's ~/.codex/config.toml for this run only; values are TOML.
        Agent::Codex => {
            let overrides = [
                format!("model_provider={}", toml_string("spindle")),
                format!("model={}", toml_string(model)),
                format!("model_providers.spindle.name={}", toml_string("Spindle")),
                format!("model_providers.spindle.base_url={}", toml_string(&v1)),
                format!("model_providers.spindle.wire_api={}", toml_string("responses")),
                format!("model_providers.spindle.env_key={}", toml_string("SPINDLE_API_KEY")),
                format!(
                    "model_providers.spindle.http_headers={{{}={}}}",
                    toml_string(SESSION_HEADER),
                    toml_string(&session_id())
                ),
            ];
            Wiring {
                set: vec![("SPINDLE_API_KEY", api_key.clone())],
                remove: vec![],
                args: overrides.into_iter().flat_map(|o| ["-c".to_string(), o]).collect(),
            }
        }
        Agent::Qwen => Wiring {
            set: vec![
                ("OPENAI_BASE_URL", v1),
                ("OPENAI_API_KEY", api_key.clone()),
                ("OPENAI_MODEL", model.clone()),
            ],
            remove: vec![],
            args: vec!["--auth-type".into(), "openai".into()],
        },
        // OpenCode merges this inline configuration over the user's own files.
        Agent::Opencode => {
            let config = serde_json::json!({
                "provider": {"spindle": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Spindle",
                    "options": {"baseURL": v1, "apiKey": api_key},
                    "models": {model.as_str(): {"name": model}},
                }},
                "model": format!("spindle/{model}"),
            });
            Wiring {
                set: vec![("OPENCODE_CONFIG_CONTENT", config.to_string())],
                remove: vec![],
                args: vec![],
            }
        }
    }
}

fn toml_string(text: &str) -> String {
    // A JSON string is a valid TOML basic string for any text.
    serde_json::Value::from(text).to_string()
}

/// The executable `program` names on `PATH`, as the shell would find it.
pub fn find_on_path(program: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path?).map(|dir| dir.join(program)).find(|candidate| {
        candidate.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

pub fn run(args: LaunchArgs) -> anyhow::Result<ExitCode> {
    let agent = args.agent;
    let program =
        find_on_path(agent.program(), std::env::var_os("PATH").as_deref()).with_context(|| {
            format!(
                "{} (`{}`) is not installed: install it with `npm install -g {}`",
                agent.product(),
                agent.program(),
                agent.npm_package()
            )
        })?;
    let (endpoint, server) = server_for(&args)?;
    let wiring = wiring(agent, &endpoint);
    let mut command = Command::new(&program);
    command.args(&wiring.args).args(&args.agent_args).envs(wiring.set.iter().map(|(k, v)| (k, v)));
    for name in &wiring.remove {
        command.env_remove(name);
    }
    eprintln!("spindle: {} → {} (model {})", agent.product(), endpoint.base_url, endpoint.model);
    let status =
        run_attached(command).with_context(|| format!("cannot run {}", program.display()))?;
    drop(server);
    Ok(exit_code(status))
}

/// The server to use: the one listening where the arguments say, or one started for the model.
fn server_for(args: &LaunchArgs) -> anyhow::Result<(Endpoint, Option<ServerProcess>)> {
    // The HTTP client runs on tokio; one thread does for the two questions asked here.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let ask = |base_url: &str| runtime.block_on(models_at(base_url, args.api_key.as_deref()));
    let key = args.api_key.clone();
    let endpoint = |base_url: String, model: String| Endpoint {
        base_url,
        api_key: key.clone().unwrap_or_else(|| PLACEHOLDER_KEY.to_string()),
        model,
    };
    if args.port != 0 {
        let base_url = format!("http://{}:{}", args.host, args.port);
        if let AtAddress::Serving(models) = ask(&base_url)? {
            let model = choose_model(&base_url, &models, args.model.as_deref())?;
            return Ok((endpoint(base_url, model), None));
        }
    }
    let spec = args.model.clone().unwrap_or_else(|| spindle_hub::DEFAULT_MODEL.to_string());
    let server = ServerProcess::start(ServeCommand {
        program: std::env::current_exe().context("cannot find the spindle executable")?,
        model: spec.clone(),
        host: args.host.clone(),
        port: args.port,
        args: Vec::new(),
        api_key: key.clone(),
        log: std::env::temp_dir().join(format!("spindle-launch-{}.log", std::process::id())),
        // The server downloads the model when it must, which takes as long as it takes; the
        // progress line shows it going.
        ready_timeout: None,
        scratch_dir: None,
    })?;
    let models = match ask(server.base_url())? {
        AtAddress::Serving(models) => models,
        AtAddress::Nothing => bail!("the server started for {spec} stopped answering"),
    };
    // The served name can differ from the spec (a path is served by its file name).
    let model = models.first().cloned().context("the started server lists no model")?;
    Ok((endpoint(server.base_url().to_string(), model), Some(server)))
}

pub fn choose_model(
    base_url: &str,
    served: &[String],
    wanted: Option<&str>,
) -> anyhow::Result<String> {
    match wanted {
        Some(name) if served.iter().any(|m| m == name) => Ok(name.to_string()),
        Some(name) => bail!(
            "the server at {base_url} does not serve `{name}`; it serves: {} (stop it, or use \
             another --port, to have launch start a server for `{name}`)",
            served.join(", ")
        ),
        None => served
            .first()
            .cloned()
            .with_context(|| format!("the server at {base_url} lists no model")),
    }
}

/// Runs the agent on this terminal. While it runs, Ctrl+C belongs to the agent (Claude Code and
/// Codex use it to interrupt a turn): `launch` ignores it, and a started server sits in its own
/// process group, out of the terminal's reach.
fn run_attached(mut command: Command) -> std::io::Result<std::process::ExitStatus> {
    let mut child: Child = command.spawn()?;
    // SAFETY: sets this process's SIGINT disposition; the agent was spawned before, so it keeps
    // the default one.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    child.wait()
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            base_url: "http://127.0.0.1:9000".into(),
            api_key: "sesame".into(),
            model: "qwen2.5-coder-0.5b".into(),
        }
    }

    fn value<'a>(wiring: &'a Wiring, name: &str) -> &'a str {
        wiring.set.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str()).unwrap()
    }

    #[test]
    fn claude_code_gets_the_server_key_and_model_for_both_slots() {
        let wiring = wiring(Agent::Claude, &endpoint());
        assert_eq!(value(&wiring, "ANTHROPIC_BASE_URL"), "http://127.0.0.1:9000");
        assert_eq!(value(&wiring, "ANTHROPIC_AUTH_TOKEN"), "sesame");
        for slot in
            ["ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"]
        {
            assert_eq!(value(&wiring, slot), "qwen2.5-coder-0.5b");
        }
        assert_eq!(wiring.remove, ["ANTHROPIC_API_KEY"]);
        assert!(wiring.args.is_empty());
        let session = format!("X-Session-ID: spindle-launch-{}", std::process::id());
        assert_eq!(value(&wiring, "ANTHROPIC_CUSTOM_HEADERS"), session);
    }

    #[test]
    fn codex_gets_a_responses_provider_on_its_command_line() {
        let wiring = wiring(Agent::Codex, &endpoint());
        let overrides: Vec<&str> = wiring
            .args
            .chunks(2)
            .map(|pair| {
                assert_eq!(pair[0], "-c");
                pair[1].as_str()
            })
            .collect();
        assert_eq!(
            overrides,
            [
                r#"model_provider="spindle""#,
                r#"model="qwen2.5-coder-0.5b""#,
                r#"model_providers.spindle.name="Spindle""#,
                r#"model_providers.spindle.base_url="http://127.0.0.1:9000/v1""#,
                r#"model_providers.spindle.wire_api="responses""#,
                r#"model_providers.spindle.env_key="SPINDLE_API_KEY""#,
                &format!(
                    r#"model_providers.spindle.http_headers={{"X-Session-ID"="spindle-launch-{}"}}"#,
                    std::process::id()
                ),
            ]
        );
        assert_eq!(value(&wiring, "SPINDLE_API_KEY"), "sesame");
        assert_eq!(toml_string(r#"a "b" \c"#), r#""a \"b\" \\c""#);
    }

    #[test]
    fn qwen_code_and_opencode_get_an_openai_provider() {
        let qwen = wiring(Agent::Qwen, &endpoint());
        assert_eq!(value(&qwen, "OPENAI_BASE_URL"), "http://127.0.0.1:9000/v1");
        assert_eq!(value(&qwen, "OPENAI_API_KEY"), "sesame");
        assert_eq!(value(&qwen, "OPENAI_MODEL"), "qwen2.5-coder-0.5b");
        assert_eq!(qwen.args, ["--auth-type", "openai"]);
        let opencode = wiring(Agent::Opencode, &endpoint());
        let config: serde_json::Value =
            serde_json::from_str(value(&opencode, "OPENCODE_CONFIG_CONTENT")).unwrap();
        assert_eq!(config["model"], "spindle/qwen2.5-coder-0.5b");
        let provider = &config["provider"]["spindle"];
        assert_eq!(provider["options"]["baseURL"], "http://127.0.0.1:9000/v1");
        assert_eq!(provider["options"]["apiKey"], "sesame");
        assert!(provider["models"]["qwen2.5-coder-0.5b"].is_object());
    }

    #[test]
    fn a_model_the_server_lacks_is_refused_with_the_ones_it_has() {
        let served = ["smollm2-135m".to_string(), "gemma3-270m".to_string()];
        let error = choose_model("http://h:1", &served, Some("nope")).unwrap_err().to_string();
        assert!(
            error.contains("does not serve `nope`; it serves: smollm2-135m, gemma3-270m"),
            "{error}"
        );
        assert_eq!(choose_model("http://h:1", &served, None).unwrap(), "smollm2-135m");
        assert_eq!(
            choose_model("http://h:1", &served, Some("gemma3-270m")).unwrap(),
            "gemma3-270m"
        );
    }

    #[test]
    fn only_executable_files_on_the_path_are_found() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("claude");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        let path = std::env::join_paths([dir.path()]).unwrap();
        assert_eq!(find_on_path("claude", Some(&path)), None);
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_on_path("claude", Some(&path)), Some(plain));
        assert_eq!(find_on_path("codex", Some(&path)), None);
        assert_eq!(find_on_path("claude", None), None);
    }
}
