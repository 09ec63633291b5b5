//! SentencePiece BPE over a GGUF vocabulary (`tokenizer.ggml.model = llama`): start from the
//! text's characters and keep joining the adjacent pair whose join is the highest-scoring
//! piece (the leftmost on a tie), as llama.cpp's `llm_tokenizer_spm` does; a character that is
//! no piece becomes its UTF-8 bytes' `<0xXX>` pieces.
//!
//! Why not the `tokenizers` crate's BPE with merges derived from the scores: it keeps the
//! vocabulary twice (piece → id and id → piece) and every (left, right) pair whose join is a
//! piece as a merge, 58 MB for Gemma 3's 262K pieces (515K merges), a sixth of that model's
//! memory. The rule needs only the pieces, their scores and an index: ~8 MB.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashTable};
use tokenizers::Token;

/// The vocabulary: every piece's text back to back, each piece's end and score, and an index
/// from text to id.
pub struct SentencePiece {
    text: String,
    ends: Vec<u32>,
    scores: Vec<f32>,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// The `<0xXX>` piece of each byte, where the vocabulary has it.
    byte_pieces: Box<[Option<u32>; 256]>,
    unknown: Option<u32>,
}

impl SentencePiece {
    /// `pieces[id]` scored `scores[id]` (a missing score counts as 0); `unknown` stands for a
    /// byte the vocabulary has no `<0xXX>` piece for. Where a text repeats, its first id wins.
    pub fn new(pieces: Vec<String>, mut scores: Vec<f32>, unknown: Option<u32>) -> Self {
        scores.resize(pieces.len(), 0.0);
        let mut vocab = Self {
            text: String::with_capacity(pieces.iter().map(String::len).sum()),
            ends: Vec::with_capacity(pieces.len()),
            scores,
            index: HashTable::with_capacity(pieces.len()),
            hasher: DefaultHashBuilder::default(),
            byte_pieces: Box::new([None; 256]),
            unknown,
        };
        for (id, piece) in pieces.into_iter().enumerate() {
            let id = id as u32;
            let Self { text, ends, index, hasher, .. } = &mut vocab;
            let hash = hasher.hash_one(piece.as_str());
            let same_text = |&other: &u32| piece_of(text, ends, other) == piece;
            let rehash = |&other: &u32| hasher.hash_one(piece_of(text, ends, other));
            if let Entry::Vacant(slot) = index.entry(hash, same_text, rehash) {
                slot.insert(id);
            }
            text.push_str(&piece);
            ends.push(text.len() as u32);
            if let Some(byte) = byte_of_piece(&piece) {
                vocab.byte_pieces[byte as usize].get_or_insert(id);
            }
        }
        vocab
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn piece(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.ends.len()).then(|| piece_of(&self.text, &self.ends, id))
    }

    pub fn id_of(&self, text: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(text);
        self.index.find(hash, |&id| piece_of(&self.text, &self.ends, id) == text).copied()
    }

    /// The pieces of `text`, with each one's byte span in it (the bytes of one character
    /// share its span).
    pub fn tokenize(&self, text: &str) -> Result<Vec<Token>, String> {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol { start, len: c.len_utf8(), piece: None })
            .collect();
        let n = symbols.len();
        // Neighbours as indices into `symbols`; `n` stands for none.
        let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { n } else { i - 1 }).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut queue = BinaryHeap::new();
        let bigram = |symbols: &[Symbol], left: usize, right: usize| -> Option<Bigram> {
            let (l, r) = (&symbols[left], &symbols[right]);
            let piece = self.id_of(&text[l.start..r.start + r.len])?;
            Some(Bigram {
                score: self.scores[piece as usize],
                left,
                right,
                len: l.len + r.len,
                piece,
            })
        };
        queue.extend((1..n).filter_map(|i| bigram(&symbols, i - 1, i)));
        while let Some(b) = queue.pop() {
            // A pair whose halves have changed since it was queued is stale.
            if symbols[b.left].len == 0
                || symbols[b.right].len == 0
                || symbols[b.left].len + symbols[b.right].len != b.len
            {
                continue;
            }
            symbols[b.left] = Symbol { len: b.len, piece: Some(b.piece), ..symbols[b.left] };
            symbols[b.right].len = 0;
            let after = next[b.right];
            next[b.left] = after;
            if after < n {
                prev[after] = b.left;
            }
            if prev[b.left] < n {
                queue.extend(bigram(&symbols, prev[b.left], b.left));
            }
            if after < n {
                queue.extend(bigram(&symbols, b.left, after));
            }
        }
        let mut tokens = Vec::new();
        let mut at = if n == 0 { n } else { 0 };
        while at < n {
            let Symbol { start, len, piece } = symbols[at];
            let span = (start, start + len);
            let single = piece.or_else(|| self.id_of(&text[span.0..span.1]));
            match single {
                Some(id) => tokens.push(self.token(id, span)),
                None => {
                    for byte in text[span.0..span.1].bytes() {
                        let id =
                            self.byte_pieces[byte as usize].or(self.unknown).ok_or_else(|| {
                                format!("the vocabulary has no piece for byte 0x{byte:02X}")
                            })?;
                        tokens.push(self.token(id, span));
                    }
                }
            }
            at = next[at];
        }
        Ok(tokens)
    }

    fn token(&self, id: u32, span: (usize, usize)) -> Token {
        Token::new(id, piece_of(&self.text, &self.ends, id).to_string(), span)
    }
}

fn piece_of<'a>(text: &'a str, ends: &[u32], id: u32) -> &'a str {
    let id = id as usize;
    let start = if id == 0 { 0 } else { ends[id - 1] as usize };
    &text[start..ends[id] as usize]
}

/// `<0xAB>` is SentencePiece's piece for the raw byte 0xAB.
pub(crate) fn byte_of_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// A run of the text: one character, or the piece a merge made of several.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// Bytes; 0 once merged into its left neighbour.
    len: usize,
    piece: Option<u32>,
}

/// Two neighbouring symbols whose join is the piece `piece`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
    piece: u32,
}

/// The heap pops the highest score first, and of equal scores the leftmost pair.
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(pieces: &[(&str, f32)]) -> SentencePiece {
        let (texts, scores): (Vec<String>, Vec<f32>) =
            pieces.iter().map(|(t, s)| (t.to_string(), *s)).unzip();
        SentencePiece::new(texts, scores, None)
    }

    fn ids(v: &SentencePiece, text: &str) -> Vec<u32> {
        v.tokenize(text).unwrap().iter().map(|t| t.id).collect()
    }

    #[test]
    fn the_highest_scoring_join_is_made_first() {
        // "ab" outscores "bc": abc is ab|c; with "bc" ahead it is a|bc.
        let v = vocab(&[("a", -1.), ("b", -1.), ("c", -1.), ("ab", -2.), ("bc", -3.)]);
        assert_eq!(ids(&v, "abc"), [3, 2]);
        let v = vocab(&[("a", -1.), ("b", -1.), ("c", -1.), ("ab", -3.), ("bc", -2.)]);
        assert_eq!(ids(&v, "abc"), [0, 4]);
    }

    #[test]
    fn equal_scores_join_the_leftmost_pair_and_merges_chain() {
        // "aa" everywhere: aaa is aa|a, not a|aa; aaaa goes on to the four-character piece.
        let v = vocab(&[("a", -1.), ("aa", -2.), ("aaaa", -3.)]);
        assert_eq!(ids(&v, "aaa"), [1, 0]);
        assert_eq!(ids(&v, "aaaa"), [2]);
        assert_eq!(ids(&v, "aaaaa"), [2, 0]);
    }

    #[test]
    fn characters_outside_the_vocabulary_become_their_bytes_with_the_characters_span() {
        let v = vocab(&[("x", -1.), ("<0xC3>", 0.), ("<0xA9>", 0.)]);
        let tokens = v.tokenize("xé").unwrap();
        let got: Vec<(u32, (usize, usize))> = tokens.iter().map(|t| (t.id, t.offsets)).collect();
        assert_eq!(got, [(0, (0, 1)), (1, (1, 3)), (2, (1, 3))]);
        let err = v.tokenize("ü").unwrap_err();
        assert!(err.contains("0xC3") || err.contains("0xBC"), "{err}");
    }

    #[test]
    fn byte_pieces_parse() {
        assert_eq!(byte_of_piece("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_of_piece("<0xE6>"), Some(0xE6));
        assert_eq!(byte_of_piece("<0x0A"), None);
        assert_eq!(byte_of_piece("<0x123>"), None);
    }

    #[test]
    fn lookups_go_both_ways_and_the_first_of_a_repeated_text_wins() {
        let v = vocab(&[("<unk>", 0.), ("▁hi", -1.), ("", 0.), ("▁hi", -5.)]);
        assert_eq!((v.id_of("▁hi"), v.id_of("<unk>"), v.id_of("nope")), (Some(1), Some(0), None));
        assert_eq!((v.piece(3), v.piece(2), v.piece(4)), (Some("▁hi"), Some(""), None));
        assert_eq!(v.len(), 4);
        assert!(v.tokenize("").unwrap().is_empty());
    }
}
