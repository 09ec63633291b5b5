//! The model stage of our tokenizer pipeline: one of the `tokenizers` crate's models (from a
//! `tokenizer.json`, or byte-level BPE from a GGUF header) or our SentencePiece BPE (GGUF
//! `llama` vocabularies). Normalizers, added tokens and decoders stay the crate's. Both ways to
//! build a vocabulary take their end-of-turn tokens from [`END_OF_TURN`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};
use tokenizers::models::bpe::BpeTrainer;
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::{
    DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Token,
    TokenizerImpl,
};

use crate::sentencepiece::SentencePiece;

/// Tokens that end a chat turn, and so end generation, wherever a vocabulary defines them.
pub(crate) const END_OF_TURN: [&str; 5] =
    ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>"];

/// The tokenizer pipeline with our model stage.
pub type Pipeline = TokenizerImpl<
    VocabModel,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

pub enum VocabModel {
    Hf(ModelWrapper),
    SentencePiece(SentencePiece),
}

/// A `tokenizer.json` names one of the crate's models.
impl<'de> Deserialize<'de> for VocabModel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(deserializer).map(Self::Hf)
    }
}

impl Model for VocabModel {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        match self {
            Self::Hf(m) => m.tokenize(sequence),
            Self::SentencePiece(m) => Ok(m.tokenize(sequence)?),
        }
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            Self::Hf(m) => m.token_to_id(token),
            Self::SentencePiece(m) => m.id_of(token),
        }
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            Self::Hf(m) => m.id_to_token(id),
            Self::SentencePiece(m) => m.piece(id).map(str::to_string),
        }
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        match self {
            Self::Hf(m) => m.get_vocab(),
            Self::SentencePiece(m) => (0..m.len() as u32)
                .rev() // so the first id of a repeated text is the one kept
                .filter_map(|id| Some((m.piece(id)?.to_string(), id)))
                .collect(),
        }
    }

    fn get_vocab_size(&self) -> usize {
        match self {
            Self::Hf(m) => m.get_vocab_size(),
            Self::SentencePiece(m) => m.len(),
        }
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        match self {
            Self::Hf(m) => m.save(folder, prefix),
            Self::SentencePiece(_) => Err("a GGUF SentencePiece vocabulary is not saved".into()),
        }
    }

    /// The trait asks for one; nothing here trains.
    fn get_trainer(&self) -> TrainerWrapper {
        match self {
            Self::Hf(m) => m.get_trainer(),
            Self::SentencePiece(_) => BpeTrainer::default().into(),
        }
    }
}
