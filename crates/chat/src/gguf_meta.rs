//! GGUF header values as the chat layer reads them (`gguf_header` reads them from a file), so
//! the text side needs no tensor library to build a tokenizer.

use std::collections::HashMap;

/// A GGUF header: key to value.
pub type GgufMetadata = HashMap<String, GgufValue>;

/// One value of a GGUF header. Integers keep only their sign: every reader here converts to
/// the width it needs and treats a value that does not fit as missing.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    UInt(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_u32(&self) -> Option<u32> {
        match *self {
            Self::UInt(v) => v.try_into().ok(),
            Self::Int(v) => v.try_into().ok(),
            _ => None,
        }
    }

    pub fn as_i32(&self) -> Option<i32> {
        match *self {
            Self::UInt(v) => v.try_into().ok(),
            Self::Int(v) => v.try_into().ok(),
            _ => None,
        }
    }

    /// Scores are stored as `f32`; the round trip through `f64` is exact.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Self::Float(v) => Some(v as f32),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GgufValue;

    #[test]
    fn integers_convert_only_when_they_fit() {
        assert_eq!(GgufValue::UInt(7).as_u32(), Some(7));
        assert_eq!(GgufValue::Int(7).as_u32(), Some(7));
        assert_eq!(GgufValue::Int(-1).as_u32(), None);
        assert_eq!(GgufValue::UInt(u64::MAX).as_i32(), None);
        assert_eq!(GgufValue::Int(-3).as_i32(), Some(-3));
        assert_eq!(GgufValue::String("7".into()).as_u32(), None);
        assert_eq!(GgufValue::Float(0.5).as_f32(), Some(0.5));
    }
}
