//! Our tokenizer as llguidance sees it: a trie over every token's bytes, control tokens
//! marked so a grammar can name them (`<|im_end|>`) but never spell them out as text.

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use spindle_chat::Tokenizer;

pub struct Vocabulary {
    trie: TokTrie,
}

impl Vocabulary {
    pub fn new(tokenizer: &Tokenizer) -> Self {
        let size = tokenizer.vocab_size() as u32;
        let words: Vec<Vec<u8>> = (0..size)
            .map(|id| match tokenizer.is_special(id) {
                true => {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend(tokenizer.token_text(id).unwrap_or_default().into_bytes());
                    marked
                }
                false => tokenizer.token_bytes(id),
            })
            .collect();
        let info = TokRxInfo {
            vocab_size: size,
            // llguidance allows this one id where the grammar may end; the mask extends that
            // to every id that ends generation.
            tok_eos: tokenizer.eos_token_ids().first().copied().unwrap_or(0),
            tok_bos: tokenizer.bos_token_id(),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        Self { trie: TokTrie::from(&info, &words) }
    }
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Longest-match tokenization: llguidance uses it only for text it forces, and we sample
    /// every token under the mask instead of forcing text.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}
