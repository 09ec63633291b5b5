//! Sizes in bytes as the command line takes and prints them (`--kv-cache-memory 2GiB`,
//! `KV cache 2.0 GiB`).

/// `bytes` in the largest binary unit that keeps it at least 1 (e.g. 2.0 GiB).
pub fn human_bytes(bytes: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", units[unit])
}

/// A size in bytes: a number with an optional unit (K, M, G, KiB, MiB, GiB; K = 1024).
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 =
        number.parse().map_err(|_| format!("'{text}' is not a size such as 512MiB or 2GiB"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit '{other}' (use K, M or G)")),
    };
    Ok((number * scale as f64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5k"), Ok(1536));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert!(parse_bytes("3PB").unwrap_err().contains("unknown size unit"));
    }

    #[test]
    fn sizes_print_in_the_largest_unit() {
        assert_eq!(human_bytes(2 << 30), "2.0 GiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100), "100.0 B");
    }
}
