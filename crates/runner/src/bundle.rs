//! A ready-to-run model: weights, tokenizer and chat template, loaded from whatever files the
//! hub resolved (a GGUF file carries all three; a safetensors folder has them side by side).

use spindle_chat::{ChatTemplate, Tokenizer};
use spindle_hub::ModelFiles;
use spindle_models::CausalLm;

use crate::error::{Result, RunnerError};

pub struct ModelBundle {
    pub model: Box<dyn CausalLm>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

impl ModelBundle {
    pub fn load(files: &ModelFiles) -> Result<Self> {
        match files {
            ModelFiles::Gguf(path) => {
                let loaded = spindle_models::load_gguf(path)?;
                let meta = loaded.gguf_metadata.as_ref().ok_or_else(|| RunnerError::Load("GGUF header missing".into()))?;
                let tokenizer = Tokenizer::from_gguf(meta)?;
                let template = ChatTemplate::from_gguf(meta, &tokenizer)?.unwrap_or_else(ChatTemplate::chatml);
                Ok(Self { model: loaded.model, tokenizer, template })
            }
            ModelFiles::Safetensors { dir } => {
                let loaded = spindle_models::load_safetensors(dir)?;
                let tokenizer = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?;
                let template = ChatTemplate::from_tokenizer_config(&dir.join("tokenizer_config.json"), &tokenizer)?
                    .unwrap_or_else(ChatTemplate::chatml);
                Ok(Self { model: loaded.model, tokenizer, template })
            }
        }
    }
}
