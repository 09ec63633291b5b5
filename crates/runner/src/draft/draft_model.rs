//! A smaller model of the target's vocabulary that drafts for it (`--draft-model`): loaded
//! after its vocabulary is checked against the target's, with a KV pool of its own carved out
//! of the same memory budget (see [`DraftModel::share_kv_memory`]).

use spindle_chat::{read_gguf_keys, Tokenizer, CHAT_TEMPLATE_KEY};
use spindle_hub::ModelFiles;
use spindle_models::{CausalLm, PagedKv};

use crate::bundle::ModelBundle;
use crate::error::{Result, RunnerError};
use crate::prefix_cache::CacheConfig;

pub struct DraftModel {
    pub model: Box<dyn CausalLm>,
    /// What the operator called it, for the startup line and errors.
    pub name: String,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftModel({})", self.name)
    }
}

impl DraftModel {
    /// Loads `files` as a draft for `target` (called `target_name`): its tokenizer first, so a
    /// draft whose vocabulary is not the target's is refused before its weights are read.
    pub fn load(
        files: &ModelFiles,
        name: &str,
        target: &ModelBundle,
        target_name: &str,
    ) -> Result<Self> {
        let refuse = |difference: String| RunnerError::DraftVocabulary {
            draft: name.into(),
            target: target_name.into(),
            difference,
        };
        vocabulary_difference(&target.tokenizer, &load_tokenizer(files)?)
            .map_or(Ok(()), |d| Err(refuse(d)))?;
        let model = match files {
            ModelFiles::Gguf(path) => spindle_models::load_gguf(path)?,
            ModelFiles::Safetensors { dir } => spindle_models::load_safetensors(dir)?,
        };
        Self::new(model, name)
    }

    /// `model` as a draft; refused where its cache could not forget a rejected draft.
    pub fn new(model: Box<dyn CausalLm>, name: &str) -> Result<Self> {
        if !model.initial_recurrent_state().is_empty() {
            return Err(RunnerError::Load(format!(
                "the draft model {name} has recurrent layers, which cannot forget rejected drafts"
            )));
        }
        Ok(Self { model, name: name.into() })
    }

    /// Moves the draft's share of `cache.kv_bytes` to `cache.draft_kv_bytes`, leaving the
    /// target the rest, so that both pools hold the same number of positions (every sequence
    /// the target holds, the draft can follow). Refuses a KV type the draft's attention heads
    /// cannot use.
    pub fn share_kv_memory(&self, cache: &mut CacheConfig, target: &ModelBundle) -> Result<()> {
        let shapes = self.model.kv_shapes();
        if let Some(d) =
            shapes.iter().flatten().map(|s| s.head_dim).find(|&d| !cache.kv_type.fits(d))
        {
            return Err(RunnerError::Load(format!(
                "KV cache type {} needs attention heads a multiple of 32 wide; the draft model {}'s are {d}",
                cache.kv_type, self.name
            )));
        }
        let target_block = cache.block_bytes(target);
        let draft_block = PagedKv::block_bytes(&shapes, cache.kv_type, cache.block_size);
        let blocks = (cache.kv_bytes / (target_block + draft_block).max(1)).max(1);
        cache.draft_kv_bytes = blocks * draft_block;
        cache.kv_bytes = blocks * target_block;
        Ok(())
    }

    /// Blocks of `block_size` positions its pool holds (at least one).
    pub fn kv_blocks(&self, cache: &CacheConfig) -> usize {
        let block = PagedKv::block_bytes(&self.model.kv_shapes(), cache.kv_type, cache.block_size);
        (cache.draft_kv_bytes / block.max(1)).max(1)
    }

    /// The startup line: what drafts, and how many positions its pool follows.
    pub fn summary(&self, cache: &CacheConfig) -> String {
        format!(
            "draft model {} ({:?}): drafts where the lookup finds nothing; its own KV pool of {} holds {} tokens",
            self.name,
            self.model.config().architecture,
            cache.kv_type,
            self.kv_blocks(cache) * cache.block_size,
        )
    }
}

/// The tokenizer of `files` alone, without the weights.
fn load_tokenizer(files: &ModelFiles) -> Result<Tokenizer> {
    Ok(match files {
        ModelFiles::Gguf(path) => {
            let mut meta = read_gguf_keys(path, &["tokenizer."])?;
            meta.remove(CHAT_TEMPLATE_KEY);
            Tokenizer::from_gguf(meta)?
        }
        ModelFiles::Safetensors { dir } => {
            Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?
        }
    })
}

/// Where `draft`'s tokens differ from `target`'s, if anywhere. The rule: the same number of
/// ids, and every id the same bytes and equally special. llama.cpp lets the sizes differ by up
/// to 128 where the shared ids agree; Spindle does not, because a draft id the target lacks or
/// reads otherwise is a wasted row in every round it appears (never a wrong byte: the target
/// verifies every draft), and same-family checkpoints ship the same tokenizer.
fn vocabulary_difference(target: &Tokenizer, draft: &Tokenizer) -> Option<String> {
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    if t != d {
        return Some(format!("{d} tokens against {t}"));
    }
    (0..t as u32).find_map(|id| {
        let same = target.token_bytes(id) == draft.token_bytes(id)
            && target.is_special(id) == draft.is_special(id);
        (!same).then(|| {
            let text = |tokenizer: &Tokenizer| tokenizer.token_text(id).unwrap_or_default();
            format!("token {id} is {:?} against {:?}", text(draft), text(target))
        })
    })
}
