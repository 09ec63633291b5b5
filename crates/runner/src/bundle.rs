//! A ready-to-run model: weights, tokenizer and chat template, loaded from whatever files the
//! hub resolved (a GGUF file carries all three; a safetensors folder has them side by side),
//! and a fingerprint naming the weights.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use spindle_chat::{read_gguf_keys, ChatTemplate, GgufMetadata, Tokenizer, CHAT_TEMPLATE_KEY};
use spindle_hub::ModelFiles;
use spindle_models::CausalLm;

use crate::disk_tier::hex;
use crate::error::{Result, RunnerError};
use crate::model_sampling::{ModelSampling, GGUF_SAMPLING_PREFIX};

/// Bytes hashed at each end of every model file.
const FINGERPRINT_SAMPLE: u64 = 4 << 20;

pub struct ModelBundle {
    pub model: Box<dyn CausalLm>,
    /// Shared with the server, which tokenizes and renders without touching the weights.
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// Names the weights ([`model_fingerprint`]); the prefix cache's disk tier keeps each
    /// model's snapshots apart by it.
    pub fingerprint: String,
    /// The sampling settings the model's files publish.
    pub sampling: ModelSampling,
}

impl ModelBundle {
    pub fn load(files: &ModelFiles) -> Result<Self> {
        Self::load_with(files, |files| {
            Ok(match files {
                ModelFiles::Gguf(path) => spindle_models::load_gguf(path)?,
                ModelFiles::Safetensors { dir } => spindle_models::load_safetensors(dir)?,
            })
        })
    }

    /// [`load`](Self::load) with the weights loaded by `load_model` (onto a GPU, say); the
    /// tokenizer, template and sampling settings come from the files as usual.
    pub fn load_with(
        files: &ModelFiles,
        load_model: impl FnOnce(&ModelFiles) -> spindle_models::Result<Box<dyn CausalLm>>,
    ) -> Result<Self> {
        let bundle = Self::load_files(files, load_model)?;
        if !bundle.sampling.ignored.is_empty() {
            tracing::info!(
                ignored = ?bundle.sampling.ignored,
                "the model's files set sampling parameters Spindle does not implement (or out of range); they are ignored"
            );
        }
        Ok(bundle)
    }

    fn load_files(
        files: &ModelFiles,
        load_model: impl FnOnce(&ModelFiles) -> spindle_models::Result<Box<dyn CausalLm>>,
    ) -> Result<Self> {
        let fingerprint = model_fingerprint(files)
            .map_err(|e| RunnerError::Load(format!("cannot read the model files: {e}")))?;
        match files {
            ModelFiles::Gguf(path) => {
                // The tokenizer before the weights: its build (the header's strings, ~30 MB for
                // Gemma 3's 262K vocabulary) then peaks on nothing, and only its tables (~8 MB)
                // sit under the weights' load.
                let mut meta = read_gguf_keys(path, &["tokenizer.", GGUF_SAMPLING_PREFIX])?;
                let sampling_meta: GgufMetadata =
                    meta.extract_if(|key, _| key.starts_with(GGUF_SAMPLING_PREFIX)).collect();
                let sampling = ModelSampling::from_gguf(&sampling_meta);
                // The template's key set apart, the tokenizer takes the header's vocabulary.
                let template_meta: GgufMetadata =
                    meta.remove_entry(CHAT_TEMPLATE_KEY).into_iter().collect();
                let tokenizer = Tokenizer::from_gguf(meta)?;
                let template = ChatTemplate::from_gguf(&template_meta, &tokenizer)?
                    .unwrap_or_else(ChatTemplate::chatml);
                let model = load_model(files)?;
                let tokenizer = Arc::new(tokenizer);
                Ok(Self { model, tokenizer, template, fingerprint, sampling })
            }
            ModelFiles::Safetensors { dir } => {
                let model = load_model(files)?;
                let tokenizer = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json"))?;
                let template = ChatTemplate::from_tokenizer_config(
                    &dir.join("tokenizer_config.json"),
                    &tokenizer,
                )?
                .unwrap_or_else(ChatTemplate::chatml);
                let sampling = ModelSampling::from_generation_config(dir);
                let tokenizer = Arc::new(tokenizer);
                Ok(Self { model, tokenizer, template, fingerprint, sampling })
            }
        }
    }
}

/// Names a model's weights without reading them all: sha256 over each file's size and its first
/// and last 4 MiB (GGUF: the one file; safetensors: `config.json` and every `*.safetensors`, in
/// name order), as 32 hex digits. Checkpoints of one shape share their headers but differ in
/// the tensors near either end; two that differ only deep inside a large file (a fine-tune of
/// middle layers alone) would share a fingerprint.
pub fn model_fingerprint(files: &ModelFiles) -> std::io::Result<String> {
    let paths = match files {
        ModelFiles::Gguf(path) => vec![path.clone()],
        ModelFiles::Safetensors { dir } => safetensors_files(dir)?,
    };
    let mut hash = Sha256::new();
    for path in paths {
        hash_ends(&path, &mut hash)?;
    }
    Ok(hex(&hash.finalize()[..16]))
}

fn safetensors_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = vec![dir.join("config.json")];
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            paths.push(path);
        }
    }
    paths[1..].sort();
    Ok(paths)
}

/// Feeds `path`'s size and the bytes of its first and last [`FINGERPRINT_SAMPLE`] into `hash`.
fn hash_ends(path: &Path, hash: &mut Sha256) -> std::io::Result<()> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    hash.update(len.to_le_bytes());
    let head = len.min(FINGERPRINT_SAMPLE);
    let mut buf = vec![0; head as usize];
    file.read_exact(&mut buf)?;
    hash.update(&buf);
    // The tail, where it does not overlap the head.
    let tail = (len - head).min(FINGERPRINT_SAMPLE);
    file.seek(SeekFrom::Start(len - tail))?;
    buf.resize(tail as usize, 0);
    file.read_exact(&mut buf)?;
    hash.update(&buf);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).unwrap();
    }

    fn gguf(path: &Path) -> String {
        model_fingerprint(&ModelFiles::Gguf(path.to_path_buf())).unwrap()
    }

    #[test]
    fn same_shape_different_weights_get_different_fingerprints() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) =
            (dir.path().join("a.gguf"), dir.path().join("b.gguf"), dir.path().join("c.gguf"));
        let weights: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        write(&a, &weights);
        let mut other = weights.clone();
        other[5_000] ^= 1;
        write(&b, &other);
        write(&c, &weights);
        assert_ne!(gguf(&a), gguf(&b));
        // The name and place of a file do not matter, only its bytes.
        assert_eq!(gguf(&a), gguf(&c));
        assert_eq!(gguf(&a).len(), 32);
    }

    #[test]
    fn large_files_are_named_by_their_size_and_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let weights = vec![3u8; 10 << 20];
        write(&path, &weights);
        let base = gguf(&path);
        let changed = |at: usize| {
            let mut w = weights.clone();
            w[at] ^= 0xff;
            write(&path, &w);
            gguf(&path)
        };
        assert_ne!(changed(0), base);
        assert_ne!(changed(weights.len() - 1), base);
        // Between the two sampled ends: the documented blind spot.
        assert_eq!(changed(weights.len() / 2), base);
        write(&path, &weights[..weights.len() - 1]);
        assert_ne!(gguf(&path), base);
    }

    #[test]
    fn a_safetensors_folder_is_named_by_its_config_and_every_shard() {
        let dir = tempfile::tempdir().unwrap();
        let fingerprint = || {
            model_fingerprint(&ModelFiles::Safetensors { dir: dir.path().to_path_buf() }).unwrap()
        };
        write(&dir.path().join("config.json"), b"{\"hidden_size\": 64}");
        write(&dir.path().join("model-00001.safetensors"), b"shard one");
        write(&dir.path().join("tokenizer.json"), b"{}");
        let one = fingerprint();
        write(&dir.path().join("model-00002.safetensors"), b"shard two");
        let two = fingerprint();
        assert_ne!(one, two);
        write(&dir.path().join("config.json"), b"{\"hidden_size\": 65}");
        assert_ne!(fingerprint(), two);
        // The tokenizer does not change the weights.
        write(&dir.path().join("config.json"), b"{\"hidden_size\": 64}");
        write(&dir.path().join("tokenizer.json"), b"{\"changed\": true}");
        assert_eq!(fingerprint(), two);
    }
}
