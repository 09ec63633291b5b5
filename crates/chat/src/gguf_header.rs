//! Reads the key/value header of a `.gguf` file (the GGUF spec's metadata section, versions 1 to
//! 3, little-endian), so a tokenizer and a chat template can be built from a model file without a
//! tensor library. The tensor table that follows the header is not read.
//!
//! A damaged or hostile file is refused with an error, never a panic or an allocation larger
//! than the file: every count and length is checked against the bytes the file has left, and
//! nested arrays against a depth limit (the same caps as llama.cpp and candle).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::ChatError;
use crate::gguf_meta::{GgufMetadata, GgufValue};

/// "GGUF" read as a little-endian `u32`.
const MAGIC: u32 = 0x4655_4747;
const MAX_STRING_LENGTH: u64 = 1 << 30;
const MAX_ARRAY_ELEMENTS: u64 = 1 << 30;
/// Arrays of arrays nest no deeper, so a crafted file cannot overflow the stack.
const MAX_VALUE_DEPTH: usize = 64;

/// The `tokenizer.*` keys of a `.gguf` header (vocabulary, special tokens, chat template).
pub fn read_tokenizer_metadata(path: &Path) -> Result<GgufMetadata, ChatError> {
    read_gguf_keys(path, &["tokenizer."])
}

/// The keys of a `.gguf` header that start with one of `prefixes` (one pass over the header, so
/// a caller wanting the tokenizer and another group reads the vocabulary once).
pub fn read_gguf_keys(path: &Path, prefixes: &[&str]) -> Result<GgufMetadata, ChatError> {
    let io = |source| ChatError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut header = Header { reader: BufReader::new(file), remaining: len, wide: true };
    header.read_keys(prefixes).map_err(|e| match e {
        HeaderError::Io(source) => io(source),
        HeaderError::Format(reason) => ChatError::BadGguf { path: path.to_path_buf(), reason },
    })
}

enum HeaderError {
    Io(std::io::Error),
    Format(String),
}

impl From<std::io::Error> for HeaderError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

type Parsed<T> = Result<T, HeaderError>;

fn refuse<T>(what: String) -> Parsed<T> {
    Err(HeaderError::Format(what))
}

/// The reader and what is left of the file behind it.
struct Header<R> {
    reader: R,
    remaining: u64,
    /// Lengths and counts are `u64` from version 2 on, `u32` in version 1.
    wide: bool,
}

impl<R: Read> Header<R> {
    fn read_keys(&mut self, prefixes: &[&str]) -> Parsed<GgufMetadata> {
        if self.u32()? != MAGIC {
            return refuse("no GGUF magic".into());
        }
        self.wide = match self.u32()? {
            1 => false,
            2 | 3 => true,
            version => return refuse(format!("unsupported GGUF version {version}")),
        };
        let _tensors = self.length()?;
        let entries = self.length()?;
        // A key/value entry takes at least a key length, a type and one byte.
        self.check_fits(entries, self.length_bytes() + 4 + 1, "metadata entries")?;
        let mut metadata = GgufMetadata::new();
        for _ in 0..entries {
            let key = self.string()?;
            let kind = self.u32()?;
            let value = self.value(kind, 0)?;
            if prefixes.iter().any(|prefix| key.starts_with(prefix)) {
                metadata.insert(key, value);
            }
        }
        Ok(metadata)
    }

    fn value(&mut self, kind: u32, depth: usize) -> Parsed<GgufValue> {
        if depth > MAX_VALUE_DEPTH {
            return refuse(format!("values nest deeper than {MAX_VALUE_DEPTH} arrays"));
        }
        Ok(match kind {
            0 => GgufValue::UInt(self.bytes::<1>()?[0].into()),
            1 => GgufValue::Int((self.bytes::<1>()?[0] as i8).into()),
            2 => GgufValue::UInt(u16::from_le_bytes(self.bytes()?).into()),
            3 => GgufValue::Int(i16::from_le_bytes(self.bytes()?).into()),
            4 => GgufValue::UInt(self.u32()?.into()),
            5 => GgufValue::Int(i32::from_le_bytes(self.bytes()?).into()),
            6 => GgufValue::Float(f32::from_le_bytes(self.bytes()?).into()),
            7 => match self.bytes::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return refuse(format!("{b} is not a bool")),
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                let item_kind = self.u32()?;
                let count = self.length()?;
                if count > MAX_ARRAY_ELEMENTS {
                    return refuse(format!("an array of {count} elements"));
                }
                self.check_fits(count, self.min_value_bytes(item_kind)?, "array elements")?;
                let items = (0..count).map(|_| self.value(item_kind, depth + 1));
                GgufValue::Array(items.collect::<Parsed<_>>()?)
            }
            10 => GgufValue::UInt(u64::from_le_bytes(self.bytes()?)),
            11 => GgufValue::Int(i64::from_le_bytes(self.bytes()?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.bytes()?)),
            other => return refuse(format!("unknown value type {other}")),
        })
    }

    /// The fewest bytes a value of type `kind` takes, to refuse an array the file cannot hold
    /// before it is allocated.
    fn min_value_bytes(&self, kind: u32) -> Parsed<u64> {
        Ok(match kind {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => self.length_bytes(),
            9 => 4 + self.length_bytes(),
            other => return refuse(format!("unknown value type {other}")),
        })
    }

    /// A string; trailing NULs (written by some converters) are dropped and invalid UTF-8 is
    /// replaced, as llama.cpp and candle read them.
    fn string(&mut self) -> Parsed<String> {
        let len = self.length()?;
        if len > MAX_STRING_LENGTH {
            return refuse(format!("a string of {len} bytes"));
        }
        self.check_fits(len, 1, "string bytes")?;
        let mut bytes = vec![0; len as usize];
        self.fill(&mut bytes)?;
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    fn length(&mut self) -> Parsed<u64> {
        Ok(if self.wide { u64::from_le_bytes(self.bytes()?) } else { self.u32()?.into() })
    }

    fn length_bytes(&self) -> u64 {
        if self.wide {
            8
        } else {
            4
        }
    }

    fn u32(&mut self) -> Parsed<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn bytes<const N: usize>(&mut self) -> Parsed<[u8; N]> {
        let mut bytes = [0; N];
        self.fill(&mut bytes)?;
        Ok(bytes)
    }

    fn fill(&mut self, buf: &mut [u8]) -> Parsed<()> {
        self.check_fits(buf.len() as u64, 1, "bytes")?;
        self.reader.read_exact(buf)?;
        self.remaining -= buf.len() as u64;
        Ok(())
    }

    /// Refuses `count` items of at least `each` bytes when the rest of the file is shorter.
    fn check_fits(&self, count: u64, each: u64, what: &str) -> Parsed<()> {
        let needed = count.saturating_mul(each);
        if needed > self.remaining {
            return refuse(format!(
                "{count} {what} need at least {needed} bytes, the file has {} left",
                self.remaining
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-3 header with `entries` (key, type, value bytes) and no tensors.
    fn header(entries: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = MAGIC.to_le_bytes().to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((entries.len() as u64).to_le_bytes());
        for (key, kind, value) in entries {
            out.extend(string(key));
            out.extend(kind.to_le_bytes());
            out.extend(value);
        }
        out
    }

    fn string(text: &str) -> Vec<u8> {
        [(text.len() as u64).to_le_bytes().as_slice(), text.as_bytes()].concat()
    }

    fn read(bytes: &[u8]) -> Parsed<GgufMetadata> {
        Header { reader: bytes, remaining: bytes.len() as u64, wide: true }
            .read_keys(&["tokenizer."])
    }

    fn refused(bytes: &[u8]) -> String {
        match read(bytes) {
            Err(HeaderError::Format(what)) => what,
            Err(HeaderError::Io(e)) => panic!("an I/O error instead of a refusal: {e}"),
            Ok(meta) => panic!("read {meta:?}"),
        }
    }

    #[test]
    fn tokenizer_keys_are_read_and_the_rest_skipped() {
        let tokens =
            [8u32.to_le_bytes().as_slice(), &2u64.to_le_bytes(), &string("a"), &string("b\0")]
                .concat();
        let bytes = header(&[
            ("general.architecture", 8, string("llama")),
            ("tokenizer.ggml.tokens", 9, tokens),
            ("tokenizer.ggml.bos_token_id", 4, 7u32.to_le_bytes().to_vec()),
            ("tokenizer.ggml.add_bos_token", 7, vec![1]),
            ("tokenizer.ggml.score", 6, 0.5f32.to_le_bytes().to_vec()),
            ("tokenizer.ggml.offset", 5, (-2i32).to_le_bytes().to_vec()),
        ]);
        let meta = read(&bytes).ok().unwrap();
        assert_eq!(meta.len(), 5, "{meta:?}");
        let tokens = meta["tokenizer.ggml.tokens"].as_array().unwrap();
        assert_eq!(tokens, [GgufValue::String("a".into()), GgufValue::String("b".into())]);
        assert_eq!(meta["tokenizer.ggml.bos_token_id"].as_u32(), Some(7));
        assert_eq!(meta["tokenizer.ggml.add_bos_token"].as_bool(), Some(true));
        assert_eq!(meta["tokenizer.ggml.score"].as_f32(), Some(0.5));
        assert_eq!(meta["tokenizer.ggml.offset"].as_i32(), Some(-2));
    }

    #[test]
    fn damaged_headers_are_refused_before_allocating() {
        assert!(refused(b"GGML\x03\0\0\0").contains("no GGUF magic"));
        let mut v9 = header(&[]);
        v9[4] = 9;
        assert!(refused(&v9).contains("unsupported GGUF version 9"));
        let mut many = header(&[]);
        many[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(refused(&many).contains("metadata entries need at least"));
        let huge_string = header(&[("tokenizer.x", 8, (1u64 << 29).to_le_bytes().to_vec())]);
        assert!(refused(&huge_string).contains("string bytes need at least"));
        let huge_array = [8u32.to_le_bytes().as_slice(), &(1u64 << 40).to_le_bytes()].concat();
        assert!(refused(&header(&[("tokenizer.x", 9, huge_array)])).contains("an array of"));
        assert!(refused(&header(&[("tokenizer.x", 13, vec![0])])).contains("unknown value type"));
        assert!(refused(&header(&[("tokenizer.x", 7, vec![2])])).contains("2 is not a bool"));
        let mut nested = Vec::new();
        for _ in 0..=MAX_VALUE_DEPTH + 1 {
            nested.extend(9u32.to_le_bytes());
            nested.extend(1u64.to_le_bytes());
        }
        nested.extend(0u32.to_le_bytes());
        assert!(refused(&header(&[("tokenizer.x", 9, nested)])).contains("nest deeper"));
        let truncated = header(&[("tokenizer.x", 10, vec![1, 2, 3])]);
        assert!(refused(&truncated).contains("bytes need at least"));
    }
}
