//! `spindle serve`: load the model, start the engine thread, serve the OpenAI API; with several
//! models, serve them all and load each on its first request (`served_models`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use spindle_chat::ToolCallFormat;
use spindle_kv_events::{Publisher, PublisherConfig};
use spindle_models::KvType;
use spindle_runner::{
    share_rollback_memory, CacheConfig, DiskConfig, KvEventsOut, SpeculationConfig, MAX_DRAFT,
};
use spindle_server::{BatchConfig, ServerConfig};

use crate::byte_size::{human_bytes, parse_bytes};
use crate::device_flag::DeviceChoice;
use crate::kv_memory::KvMemory;
use crate::logging::{announce, LogFormat};
use crate::model_loading::{check_guided_json, load_draft, model_id, sampling_summary, Loading};

#[derive(Args)]
pub struct ServeArgs {
    /// Catalogue name, .gguf file, or folder with config.json + safetensors + tokenizer.json.
    /// Repeat it to serve several models (the first answers requests that name none); default:
    /// the catalogue's default model, unless --models-dir is given.
    #[arg(long)]
    model: Vec<String>,
    #[command(flatten)]
    models: crate::served_models::ModelsArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer <KEY>` on /v1 routes.
    #[arg(long, env = "SPINDLE_API_KEY")]
    api_key: Option<String>,
    /// Requests generating at once, batched into each model step; more wait in a queue.
    #[arg(long, default_value_t = 16)]
    max_concurrent: usize,
    /// Requests allowed to wait; beyond that the server answers 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Context size per request in tokens (prompt + completion); default: the length the model
    /// was trained for, capped by what --kv-cache-memory holds.
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Turn thinking off unless a request enables it (`chat_template_kwargs.enable_thinking`).
    #[arg(long)]
    no_thinking: bool,
    /// Default reasoning-token budget per request.
    #[arg(long)]
    thinking_budget: Option<usize>,
    /// Template variables for every request, as a JSON object.
    #[arg(long)]
    chat_template_kwargs: Option<String>,
    /// A Jinja chat template file that replaces the model's own.
    #[arg(long)]
    chat_template: Option<std::path::PathBuf>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Memory for attention keys/values of running sequences and the prefix cache (e.g. 2GiB),
    /// or `auto`: 70% of the memory available once the weights are loaded, less
    /// --snapshot-memory, at least 256MiB (2GiB where available memory cannot be read).
    #[arg(long, default_value = "2GiB", value_parser = str::parse::<KvMemory>)]
    kv_cache_memory: KvMemory,
    /// How keys and values are stored: f16 (half of f32's memory, so twice the tokens fit),
    /// bf16, q8_0 (blocks of 32 int8 values with an f16 scale, 34 bytes per 32 values) or f32.
    /// The README states each type's drift from f32.
    #[arg(long, default_value = "f16", value_parser = str::parse::<KvType>)]
    kv_cache_type: KvType,
    /// Memory for prefix-cache snapshots: recurrent states of hybrid models and end-of-prompt
    /// logits.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    snapshot_memory: usize,
    /// Also keep prefix-cache snapshots in this folder (a subfolder per model), so a restarted
    /// server resumes prompts it has seen instead of prefilling them again.
    #[arg(long)]
    prefix_cache_dir: Option<std::path::PathBuf>,
    /// Disk space for those snapshots per model; the least recently used go first.
    #[arg(long, default_value = "8GiB", value_parser = parse_bytes)]
    prefix_cache_disk_size: usize,
    /// CPU threads for the kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Tool-call syntax to parse and enforce: qwen3_xml, hermes or llama3_json (default: the
    /// one the chat template uses, else hermes).
    #[arg(long, value_parser = parse_tool_call_parser)]
    tool_call_parser: Option<ToolCallFormat>,
    /// JSON schema every answer follows unless a request sets `response_format`: the schema
    /// itself, or @FILE.
    #[arg(long)]
    guided_json: Option<String>,
    /// When a client gives up while its prompt is read, read on (while no one else waits) if at
    /// most this many positions are left, so its retry finds the prompt cached; 0 turns it off.
    /// Default: the context size.
    #[arg(long)]
    orphan_prefill_tokens: Option<usize>,
    /// Seconds of quiet after which a stream sends a keep-alive event.
    #[arg(long, default_value_t = 15)]
    keep_alive_seconds: u64,
    /// Folder of the Batch API's files and batches; unfinished batches resume from it at start.
    /// Default: $SPINDLE_HOME/batches.
    #[arg(long)]
    batch_dir: Option<std::path::PathBuf>,
    /// Decode plainly unless a request says `"speculative": true`. By default each step drafts
    /// the tokens that followed the latest earlier occurrence of the last few and keeps those
    /// the model picks itself: the output is the same byte for byte (attention-only models).
    #[arg(long)]
    no_speculate: bool,
    /// A smaller model of the same vocabulary (catalogue name, .gguf file or folder, as
    /// --model) that drafts where the lookup finds nothing; its keys and values take their
    /// share of --kv-cache-memory. Refused at start when its tokens are not the model's.
    #[arg(long)]
    draft_model: Option<String>,
    /// Most tokens drafted per speculative round.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=MAX_DRAFT as i64))]
    draft_max: u16,
    /// Most tokens a round drafts with the model's multi-token-prediction head (Qwen3.5 /
    /// Qwen3.6 / Qwen3-Next checkpoints that carry one) where the lookup finds nothing; 0 (the
    /// default) leaves the head unused. The output stays the same byte for byte.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=MAX_DRAFT as i64))]
    spec_mtp: u16,
    /// On SIGTERM or SIGINT the server stops admitting (`/health` and new requests answer 503)
    /// and waits this long for the requests in flight to end before it cancels them and exits;
    /// a second signal exits at once.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_seconds: u64,
    /// Publish the blocks entering and leaving the prefix cache as KV-cache events, as vLLM
    /// does, on a ZeroMQ PUB socket at this endpoint (e.g. tcp://*:5557), for llm-d's precise
    /// prefix-cache scorer. Off by default.
    #[arg(long)]
    kv_events_endpoint: Option<String>,
    /// With --kv-events-endpoint: answer requests for missed event batches (the last 10,000)
    /// on a ROUTER socket at this endpoint (e.g. tcp://*:5558).
    #[arg(long, requires = "kv_events_endpoint")]
    kv_events_replay_endpoint: Option<String>,
    #[command(flatten)]
    sampling: crate::sampling_flags::SamplingFlags,
    /// Where model steps run: cpu, gpu (the first GPU found) or gpu:N (an adapter by index).
    #[arg(long, default_value = "cpu", value_parser = str::parse::<DeviceChoice>)]
    device: DeviceChoice,
    #[command(flatten)]
    placement: crate::placement_flags::PlacementFlags,
}

fn parse_tool_call_parser(name: &str) -> Result<ToolCallFormat, String> {
    ToolCallFormat::from_name(name).ok_or_else(|| {
        format!(
            "unknown tool-call parser `{name}`; expected one of {}",
            ToolCallFormat::NAMES.join(", ")
        )
    })
}

/// The `--guided-json` schema, read from the file when given as @FILE.
fn guided_json(arg: &str) -> anyhow::Result<serde_json::Value> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --guided-json file {path}"))?,
        None => arg.to_string(),
    };
    let schema: serde_json::Value =
        serde_json::from_str(&text).context("--guided-json is not JSON")?;
    anyhow::ensure!(schema.is_object(), "--guided-json must be a JSON schema object");
    Ok(schema)
}

pub fn run(args: ServeArgs, log_format: LogFormat) -> anyhow::Result<()> {
    // First: a GPU asked for and missing refuses the start before anything loads.
    let gpu = crate::device_flag::open(args.device)?;
    // The device pools hold f16 or f32 (the host pool, sized alike, stays unwritten).
    let kv_type = args.kv_cache_type;
    if gpu.is_some() && !matches!(kv_type, KvType::F16 | KvType::F32) {
        anyhow::bail!(
            "--kv-cache-type {kv_type} with --device gpu: the GPU stores keys and values as f16 \
             (the default) or f32"
        );
    }
    crate::set_threads(args.threads);
    let chat_template_kwargs = match &args.chat_template_kwargs {
        Some(text) => {
            serde_json::from_str(text).context("--chat-template-kwargs is not a JSON object")?
        }
        None => serde_json::Map::new(),
    };
    let guided_json = args.guided_json.as_deref().map(guided_json).transpose()?;
    let sampling = args.sampling.preset()?;
    if let Some(dir) = &args.prefix_cache_dir {
        // Fail at once on a folder that cannot be used, not later in the engine thread's log.
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create --prefix-cache-dir {}", dir.display()))?;
    }
    let batch_dir =
        args.batch_dir.clone().unwrap_or_else(|| spindle_hub::spindle_home().join("batches"));
    std::fs::create_dir_all(&batch_dir)
        .with_context(|| format!("cannot create --batch-dir {}", batch_dir.display()))?;
    let specs = crate::served_models::specs(&args.model, args.models.models_dir.as_deref())?;
    if args.draft_model.is_some() && specs.len() > 1 {
        anyhow::bail!("--draft-model drafts for one --model; {} are served", specs.len());
    }
    let kv_bytes = args.kv_cache_memory.resolve(args.snapshot_memory);
    let mut placement =
        args.placement.request(gpu.is_some(), kv_bytes, args.max_concurrent.max(1))?;
    placement.draft_head = args.spec_mtp > 0;
    let address = reserve_address(&args.host, args.port)?;
    let events = kv_events(&args, address.local_addr()?.port(), log_format)?;
    let cache = CacheConfig {
        events,
        kv_bytes,
        kv_type,
        snapshot_bytes: args.snapshot_memory,
        disk: args
            .prefix_cache_dir
            .clone()
            .map(|dir| DiskConfig { dir, bytes: args.prefix_cache_disk_size }),
        ..CacheConfig::default()
    };
    let mut loading = Loading {
        chat_template: args.chat_template.clone(),
        kv_memory: args.kv_cache_memory,
        kv_type,
        ctx_size: args.ctx_size,
        gpu: gpu.clone(),
        placement,
    };
    let mut config = ServerConfig {
        model_id: model_id(&specs[0]),
        api_key: args.api_key,
        max_concurrent: args.max_concurrent.max(1),
        max_queue: args.max_queue,
        // Each model's own where several are served (sized at its load).
        ctx_size: args.ctx_size.unwrap_or(usize::MAX),
        thinking_default: !args.no_thinking,
        thinking_budget: args.thinking_budget,
        chat_template_kwargs,
        max_body_bytes: args.max_body_bytes,
        cache,
        tool_call_parser: args.tool_call_parser,
        guided_json,
        keep_alive: std::time::Duration::from_secs(args.keep_alive_seconds.max(1)),
        orphan_prefill_tokens: args.orphan_prefill_tokens.unwrap_or(usize::MAX),
        batch: BatchConfig::new(batch_dir),
        speculation: SpeculationConfig {
            by_default: !args.no_speculate,
            max_draft: args.draft_max.into(),
            mtp_max_draft: args.spec_mtp.into(),
            ..SpeculationConfig::default()
        },
        sampling,
        shutdown_grace: Duration::from_secs(args.shutdown_grace_seconds),
    };
    let state = if let [spec] = specs.as_slice() {
        let files = spindle_hub::resolve(
            spec,
            &spindle_hub::spindle_home(),
            spindle_hub::WhenMissing::Download,
        )?;
        loading.size_kv_on_gpu(&files, &mut config.cache)?;
        let (bundle, placement_line) = loading.bundle(&files)?;
        let draft = (args.draft_model.as_deref())
            .map(|spec| load_draft(spec, &bundle, &config.model_id, &mut config.cache))
            .transpose()?;
        let draft_summary = draft.as_ref().map(|draft| draft.summary(&config.cache));
        config.speculation.draft_model = draft.map(std::sync::Arc::new);
        let rollback_summary = share_rollback_memory(
            &bundle,
            &mut config.cache,
            config.max_concurrent,
            &config.speculation,
        )
        .map(|share| share.summary(config.speculation.max_draft));
        loading.check_kv_binds(&bundle, &config.cache)?;
        let fitted = loading.fit(&bundle, &config.cache);
        config.ctx_size = fitted.ctx_size;
        config.orphan_prefill_tokens = args.orphan_prefill_tokens.unwrap_or(fitted.ctx_size);
        let summary = loading.summary(&config.model_id, &fitted, &bundle, &config.cache);
        let state = spindle_server::start(config, bundle)?;
        let (_, model) = &state.models.loaded()[0];
        check_guided_json(&state.config, model)?;
        // After every check that can refuse to start, so a refusal is the only line.
        announce(log_format, &summary);
        let lines = placement_line.iter().chain(&draft_summary).chain(&rollback_summary);
        for line in lines {
            announce(log_format, line);
        }
        for line in sampling_summary(&state.config, model) {
            announce(log_format, &line);
        }
        state
    } else {
        let budget = args.models.models_memory.resolve(0) as u64;
        let ttl = (args.models.model_ttl > 0).then(|| Duration::from_secs(args.models.model_ttl));
        let models = crate::served_models::registry(&specs, &config, loading, budget, ttl)?;
        let names: Vec<String> = models.list().into_iter().map(|(e, _)| e.name).collect();
        announce(
            log_format,
            &format!(
                "serving {} models, each loaded on its first request within {} (idle ones unloaded after {}): {}",
                names.len(),
                human_bytes(budget as usize),
                ttl.map_or("never".into(), |t| format!("{} s", t.as_secs())),
                names.join(", ")
            ),
        );
        spindle_server::start_with_registry(config, models)
    };
    if let Some(gpu) = &gpu {
        announce(log_format, &crate::device_flag::announce_line(gpu, kv_type));
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = address
            .listen(LISTEN_BACKLOG)
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        announce(log_format, &format!("listening on http://{}", listener.local_addr()?));
        spindle_server::serve(listener, state, stop_signals()).await?;
        Ok(())
    })
}

/// Connections the kernel queues before the server accepts them.
const LISTEN_BACKLOG: u32 = 1024;

/// The HTTP address, bound before any model loads but not listened on yet: a port taken fails
/// the start at once, `--port 0` knows its port for the KV-cache events' topic, and a client is
/// refused (not kept waiting) until the server listens.
fn reserve_address(host: &str, port: u16) -> anyhow::Result<tokio::net::TcpSocket> {
    let cannot = || format!("cannot listen on {host}:{port}");
    let address = (host, port)
        .to_socket_addrs()
        .with_context(cannot)?
        .next()
        .with_context(|| format!("{}: the host resolves to no address", cannot()))?;
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .with_context(cannot)?;
    // As the standard library's listeners do: a restarted server takes its port back at once.
    socket.set_reuseaddr(true).with_context(cannot)?;
    socket.bind(address).with_context(cannot)?;
    Ok(socket)
}

/// The KV-cache events' publisher, its sockets bound, when --kv-events-endpoint asks for one;
/// its topic names this replica by `--host` and the HTTP port bound.
fn kv_events(
    args: &ServeArgs,
    http_port: u16,
    log_format: LogFormat,
) -> anyhow::Result<Option<KvEventsOut>> {
    let Some(endpoint) = &args.kv_events_endpoint else { return Ok(None) };
    let config = PublisherConfig {
        endpoint: endpoint.clone(),
        replay_endpoint: args.kv_events_replay_endpoint.clone(),
        replay_window: 10_000,
    };
    let (publisher, bound) = Publisher::start(config)?;
    let replay = bound.replay_endpoint.map_or(String::new(), |r| format!(", replays on {r}"));
    announce(log_format, &format!("KV-cache events on {}{replay}", bound.endpoint));
    // The topic names this replica as routers reach it.
    Ok(Some(KvEventsOut::new(publisher, &format!("{}:{http_port}", args.host))))
}

/// Resolves on the first SIGTERM (service managers, `kill`, Kubernetes) or SIGINT (Ctrl-C),
/// which starts the drain; a second one ends the process at once, for an operator who will not
/// wait for it.
async fn stop_signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("install the SIGINT handler");
    let mut next = async move || {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        }
    };
    let first = next().await;
    tracing::info!(signal = first, "asked to stop: draining (a second signal exits at once)");
    tokio::spawn(async move {
        let second = next().await;
        tracing::warn!(signal = second, "asked again: exiting without waiting for the drain");
        std::process::exit(1);
    });
}
