//! Where weights come from: a GGUF file or a folder of safetensors.
//!
//! Architectures ask for tensors by llama.cpp's GGUF names (`blk.3.attn_q.weight`), the one
//! naming scheme shared by every family; the safetensors source translates them to HF keys.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::block_quants::{BlockFormat, BlockMatrix};
use crate::config::Architecture;
use crate::error::{ModelError, Result};
use crate::linear::{Embedding, Linear};
use crate::weight::Weight;

/// Opened model weights.
pub enum WeightSource {
    Gguf(GgufWeights),
    Safetensors(SafetensorsWeights),
}

pub struct GgufWeights {
    path: PathBuf,
    file: File,
    content: gguf_file::Content,
    storage: GgufStorage,
}

/// How a GGUF file's quantized tensors are held in memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum GgufStorage {
    /// As stored, run by the quantized kernels.
    AsStored,
    /// Dequantized to f32 on load (see [`crate::load_gguf_f32`]).
    F32,
}

pub struct SafetensorsWeights {
    tensors: MmapedSafetensors,
    architecture: Architecture,
    /// `model.` for text-only checkpoints, `model.language_model.` for multimodal wrappers.
    prefix: String,
}

impl GgufWeights {
    /// Reads the header of a GGUF file; tensor data is read on demand.
    pub fn open(path: &Path, storage: GgufStorage) -> Result<Self> {
        let mut file =
            File::open(path).map_err(|source| ModelError::Io { path: path.into(), source })?;
        // Buffered: the header is read a value at a time, and a vocabulary is ~10^6 values.
        let content = gguf_file::Content::read(&mut std::io::BufReader::new(&mut file))
            .map_err(|e| gguf_error(path, e))?;
        let file_len =
            file.metadata().map_err(|source| ModelError::Io { path: path.into(), source })?.len();
        check_tensor_sizes(&content, file_len)
            .map_err(|reason| ModelError::BadGguf { path: path.into(), reason })?;
        Ok(Self { path: path.into(), file, content, storage })
    }

    pub fn metadata(&self) -> &HashMap<String, gguf_file::Value> {
        &self.content.metadata
    }

    /// The dimensions of tensor `name`, as the header gives them (outermost first).
    pub fn dims(&self, name: &str) -> Result<&[usize]> {
        let info = self.content.tensor_infos.get(name);
        Ok(info.ok_or_else(|| ModelError::MissingTensor(name.to_string()))?.shape.dims())
    }

    /// A 2-D block-quantized tensor (Q4_0 … Q8_0) kept as stored, read from the file a group
    /// of rows at a time into its tiles; `None` for other types or when the file is loaded as
    /// f32.
    fn block_matrix(&mut self, name: &str) -> Result<Option<BlockMatrix>> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let (Some(format), &[rows, cols], GgufStorage::AsStored) =
            (BlockFormat::of(info.ggml_dtype), info.shape.dims(), self.storage)
        else {
            return Ok(None);
        };
        let io = |source| ModelError::Io { path: self.path.clone(), source };
        let start = self.content.tensor_data_offset + info.offset;
        self.file.seek(SeekFrom::Start(start)).map_err(io)?;
        let file = &mut self.file;
        BlockMatrix::read(format, rows, cols, |rows| file.read_exact(rows).map_err(io)).map(Some)
    }

    /// Drops the `tokenizer.*` keys: the weights never read them, and a 262K-token vocabulary's
    /// strings and scores would otherwise stay in memory while every tensor is loaded.
    pub fn without_tokenizer(mut self) -> Self {
        self.content.metadata.retain(|key, _| !key.starts_with("tokenizer."));
        self
    }
}

/// Checks every tensor's shape against the file before candle reads one: candle multiplies the
/// dimensions unchecked (a damaged header's overflow panics) and casts an empty tensor's
/// dangling buffer to a block type (misaligned, which is undefined behaviour).
fn check_tensor_sizes(
    content: &gguf_file::Content,
    file_len: u64,
) -> std::result::Result<(), String> {
    for (name, info) in &content.tensor_infos {
        let dims = info.shape.dims();
        let elements = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let bytes = elements.and_then(|n| {
            (n / info.ggml_dtype.block_size()).checked_mul(info.ggml_dtype.type_size())
        });
        match (elements, bytes) {
            (Some(0), _) => return Err(format!("tensor '{name}' of shape {dims:?} is empty")),
            (Some(_), Some(bytes)) if bytes as u64 <= file_len => {}
            _ => {
                return Err(format!(
                    "tensor '{name}' of shape {dims:?} is larger than the file ({file_len} bytes)"
                ))
            }
        }
    }
    Ok(())
}

/// Turns candle's GGUF parse errors into ones that name the problem.
fn gguf_error(path: &Path, e: candle_core::Error) -> ModelError {
    let reason = crate::error::first_line(&e);
    if let Some(code) =
        reason.strip_prefix("unknown dtype for tensor ").and_then(|c| c.trim().parse().ok())
    {
        return ModelError::UnsupportedQuant { path: path.into(), code };
    }
    ModelError::BadGguf { path: path.into(), reason }
}

impl SafetensorsWeights {
    /// Memory-maps every `*.safetensors` file of a folder.
    pub fn open(dir: &Path, architecture: Architecture) -> Result<Self> {
        let entries =
            std::fs::read_dir(dir).map_err(|source| ModelError::Io { path: dir.into(), source })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::BadConfig(format!(
                "no .safetensors files in {}",
                dir.display()
            )));
        }
        // SAFETY: the files are mapped read-only and not modified while the model lives.
        let tensors = unsafe { MmapedSafetensors::multi(&files) }?;
        let prefix = if tensors.get("model.language_model.embed_tokens.weight").is_ok() {
            "model.language_model."
        } else {
            "model."
        };
        Ok(Self { tensors, architecture, prefix: prefix.to_string() })
    }

    /// The checkpoint tensor `name` under the model prefix (`layers.0.…`), or at the top level
    /// for names outside it (`lm_head.weight`), as dense f32.
    pub fn model_tensor(&self, name: &str) -> Result<Tensor> {
        let key = self
            .model_key(name)
            .ok_or_else(|| ModelError::MissingTensor(format!("{}{name}", self.prefix)))?;
        Ok(self.tensors.load(&key, &Device::Cpu)?.to_dtype(DType::F32)?)
    }

    pub fn has_model_tensor(&self, name: &str) -> bool {
        self.model_key(name).is_some()
    }

    fn model_key(&self, name: &str) -> Option<String> {
        [format!("{}{name}", self.prefix), name.to_string()]
            .into_iter()
            .find(|k| self.tensors.get(k).is_ok())
    }

    /// Translates a GGUF tensor name to the HF checkpoint key.
    fn hf_name(&self, gguf: &str) -> String {
        let p = &self.prefix;
        if let Some(rest) = gguf.strip_prefix("blk.") {
            let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
            let (base, suffix) = rest.rsplit_once('.').unwrap_or((rest, "weight"));
            let hf = match (base, self.architecture) {
                ("attn_norm", _) => "input_layernorm",
                ("ffn_norm", Architecture::Gemma3) => "pre_feedforward_layernorm",
                ("ffn_norm", _) => "post_attention_layernorm",
                ("post_attention_norm", _) => "post_attention_layernorm",
                ("post_ffw_norm", _) => "post_feedforward_layernorm",
                ("attn_q", _) => "self_attn.q_proj",
                ("attn_k", _) => "self_attn.k_proj",
                ("attn_v", _) => "self_attn.v_proj",
                ("attn_output", _) => "self_attn.o_proj",
                ("attn_q_norm", _) => "self_attn.q_norm",
                ("attn_k_norm", _) => "self_attn.k_norm",
                ("ffn_gate", _) => "mlp.gate_proj",
                ("ffn_up", _) => "mlp.up_proj",
                ("ffn_down", _) => "mlp.down_proj",
                (other, _) => other,
            };
            return format!("{p}layers.{layer}.{hf}.{suffix}");
        }
        match gguf {
            "token_embd.weight" => format!("{p}embed_tokens.weight"),
            "output_norm.weight" => format!("{p}norm.weight"),
            "output.weight" => "lm_head.weight".to_string(),
            other => other.to_string(),
        }
    }
}

impl WeightSource {
    /// A GGUF file's tensors as its header gives them, without reading their data: name,
    /// stored type and dimensions (outermost first). Empty for a checkpoint.
    pub fn stored_tensors(&self) -> Vec<(&str, GgmlDType, &[usize])> {
        match self {
            Self::Gguf(g) => g
                .content
                .tensor_infos
                .iter()
                .map(|(name, info)| (name.as_str(), info.ggml_dtype, info.shape.dims()))
                .collect(),
            Self::Safetensors(_) => Vec::new(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match self {
            Self::Gguf(g) => g.content.tensor_infos.contains_key(name),
            Self::Safetensors(s) => s.tensors.get(&s.hf_name(name)).is_ok(),
        }
    }

    /// Loads one tensor, quantized where the file stores it quantized.
    pub fn weight(&mut self, name: &str) -> Result<Weight> {
        match self {
            Self::Gguf(g) => {
                if !g.content.tensor_infos.contains_key(name) {
                    return Err(ModelError::MissingTensor(name.to_string()));
                }
                let q = g
                    .content
                    .tensor(&mut g.file, name, &Device::Cpu)
                    .map_err(|e| gguf_error(&g.path, e))?;
                match q.dtype() {
                    _ if g.storage == GgufStorage::F32 => {
                        Ok(Weight::Dense(q.dequantize(&Device::Cpu)?))
                    }
                    GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                        Ok(Weight::Dense(q.dequantize(&Device::Cpu)?))
                    }
                    _ => Ok(Weight::Quantized(Arc::new(q))),
                }
            }
            Self::Safetensors(s) => {
                let hf = s.hf_name(name);
                let t =
                    s.tensors.load(&hf, &Device::Cpu).map_err(|_| ModelError::MissingTensor(hf))?;
                Ok(Weight::Dense(t.to_dtype(DType::F32)?))
            }
        }
    }

    /// Loads a tensor as dense f32 (norms, biases).
    pub fn dense(&mut self, name: &str) -> Result<Tensor> {
        match self.weight(name)? {
            Weight::Dense(t) => Ok(t),
            Weight::Quantized(q) => Ok(q.dequantize(&Device::Cpu)?),
        }
    }

    /// Loads `{name}.weight` and, when present, `{name}.bias` as a linear layer.
    pub fn linear(&mut self, name: &str) -> Result<Linear> {
        let weight = self.weight(&format!("{name}.weight"))?;
        let bias_name = format!("{name}.bias");
        let bias = if self.contains(&bias_name) { Some(self.dense(&bias_name)?) } else { None };
        Linear::new(weight, bias)
    }

    /// The token embedding table, and the output projection (tied to it when the file has none).
    pub fn embedding_and_head(&mut self) -> Result<(Embedding, Linear)> {
        const TABLE: &str = "token_embd.weight";
        if self.contains("output.weight") {
            return Ok((Embedding::new(self.weight(TABLE)?)?, self.linear("output")?));
        }
        // A tied block-quantized table goes straight into the tiles the head and the embedding
        // share: read whole first, Gemma 3's 178 MB table would sit beside its tiles.
        if let Self::Gguf(g) = self {
            if let Some(tiles) = g.block_matrix(TABLE)? {
                let tiles = Arc::new(tiles);
                return Ok((Embedding::from_tiles(tiles.clone()), Linear::from_tiles(tiles)));
            }
        }
        let table = self.weight(TABLE)?;
        let head = Linear::new(table.share(), None)?;
        Ok((Embedding::tied(table, &head)?, head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #20's fuzzing: a damaged tensor table panicked in candle (dimension overflow, and
    /// the misaligned cast of an empty tensor's buffer) before any size was checked.
    #[test]
    fn tensors_empty_or_larger_than_the_file_are_refused() {
        let content = |dims: Vec<usize>| gguf_file::Content {
            magic: gguf_file::VersionedMagic::GgufV3,
            metadata: HashMap::new(),
            tensor_infos: HashMap::from([(
                "w".to_string(),
                gguf_file::TensorInfo { ggml_dtype: GgmlDType::F32, shape: dims.into(), offset: 0 },
            )]),
            tensor_data_offset: 0,
        };
        assert_eq!(check_tensor_sizes(&content(vec![4, 8]), 128), Ok(()));
        let refused = |dims: Vec<usize>| check_tensor_sizes(&content(dims), 128).unwrap_err();
        assert!(refused(vec![4, 0]).contains("is empty"));
        assert!(refused(vec![4, 9]).contains("larger than the file (128 bytes)"));
        assert!(refused(vec![1 << 40, 1 << 40]).contains("larger than the file"));
        assert!(refused(vec![1 << 62]).contains("larger than the file"));
    }
}
