//! How the server was started: the flags of `spindle serve` that the handlers read.

use serde_json::{Map, Value};
use spindle_chat::ToolCallFormat;
use spindle_runner::model_sampling::SamplingPreset;
use spindle_runner::{CacheConfig, SpeculationConfig};

use crate::batch_store::BatchConfig;

/// How the server was started.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The id clients use in `model` (and see in `/v1/models`); with several models, the
    /// first's, which answers requests that name none.
    pub model_id: String,
    /// When set, every `/v1` request needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Sequences generating at once.
    pub max_concurrent: usize,
    /// Requests allowed to wait beyond those; more get 429.
    pub max_queue: usize,
    /// Positions per sequence (prompt + completion) of the model loaded at start; with
    /// several models each is sized at its load (`--ctx-size`, else what it and its pool hold).
    pub ctx_size: usize,
    /// `--no-thinking`: thinking is off unless a request turns it on.
    pub thinking_default: bool,
    /// Default reasoning-token budget when a request names none.
    pub thinking_budget: Option<usize>,
    /// Template variables applied to every request (a request's own kwargs win).
    pub chat_template_kwargs: Map<String, Value>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// KV storage and prefix-cache sizes, and the prefix cache's folder on disk if any.
    pub cache: CacheConfig,
    /// `--tool-call-parser`: the tool-call syntax, when not the one the chat template uses.
    pub tool_call_parser: Option<ToolCallFormat>,
    /// `--guided-json`: the schema every answer follows unless a request sets `response_format`.
    pub guided_json: Option<Value>,
    /// Quiet time after which a stream sends a keep-alive (while its prompt waits or is read).
    pub keep_alive: std::time::Duration,
    /// `--orphan-prefill-tokens`: how much of a prompt whose client left is still read while
    /// the engine is idle (0: none).
    pub orphan_prefill_tokens: usize,
    /// `--batch-dir` and the Batch API's size limits.
    pub batch: BatchConfig,
    /// `--no-speculate`, `--draft-max` and `--spec-mtp`: whether requests decode speculatively
    /// unless they say, how far, and whether the model's MTP head drafts too.
    pub speculation: SpeculationConfig,
    /// `--temperature`, `--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`: the defaults of a
    /// request that leaves them out, over the model's own.
    pub sampling: SamplingPreset,
    /// `--shutdown-grace-seconds`: how long a drain waits for the requests in flight to end
    /// before it cancels them.
    pub shutdown_grace: std::time::Duration,
}
