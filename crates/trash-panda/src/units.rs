//! Byte sizes as users write them ("9GB", "1.5GiB", "500MB").
//!
//! Decimal units (kB, MB, GB, TB, or K, M, G, T alone) are powers of 1000 and binary units (KiB,
//! MiB, GiB, TiB) powers of 1024, as in the options of the spec (`max_vram="9GB"` means
//! 9 000 000 000 bytes). A bare number is bytes and may use an exponent (`1e9`).

/// What [`parse_bytes`] accepts, quoted in its errors: every spelling `unit_factor` takes is
/// named (a test checks both ways), so a user is never told less than the parser accepts.
pub const ACCEPTED_SIZES: &str = "a non-negative number of bytes (\"123456\", \"1e9\") optionally \
     followed by a unit: B; kB or K, MB or M, GB or G, TB or T (powers of 1000); KiB, MiB, GiB, \
     TiB (powers of 1024); any case, e.g. \"9GB\", \"9G\", \"1.5 GiB\", \"500MB\"";

/// Every unit spelling [`parse_bytes`] takes (any case), with its factor: the one table the
/// parser reads and [`ACCEPTED_SIZES`] is checked against.
const UNITS: [(&str, f64); 14] = [
    ("", 1.0),
    ("B", 1.0),
    ("kB", 1e3),
    ("K", 1e3),
    ("MB", 1e6),
    ("M", 1e6),
    ("GB", 1e9),
    ("G", 1e9),
    ("TB", 1e12),
    ("T", 1e12),
    ("KiB", 1024.0),
    ("MiB", 1048576.0),
    ("GiB", 1073741824.0),
    ("TiB", 1099511627776.0),
];

/// Errors of the units module.
///
/// What to do: write the size as the message lists: bytes, or a number and a unit such as `"9GB"`
/// or `"1.5GiB"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    /// The text was empty or only whitespace.
    #[error("empty size: expected {accepted}")]
    Empty {
        /// Always [`ACCEPTED_SIZES`], so the message tells the user what to write instead.
        accepted: &'static str,
    },
    /// The number part is missing, negative, not a finite number, or the product with the
    /// unit does not fit in a `u64` of bytes.
    #[error("invalid size {value:?}: {reason}; expected {accepted}")]
    Invalid {
        /// The text as the caller passed it, untrimmed.
        value: String,
        /// Which rule the number broke, in a few words ("no number", "too large", ...).
        reason: &'static str,
        /// Always [`ACCEPTED_SIZES`].
        accepted: &'static str,
    },
    /// The number parsed but the letters after it name no known unit.
    #[error("invalid size {value:?}: unknown unit {unit:?}; expected {accepted}")]
    UnknownUnit {
        /// The text as the caller passed it, untrimmed.
        value: String,
        /// The trimmed text after the number, as written (case kept).
        unit: String,
        /// Always [`ACCEPTED_SIZES`].
        accepted: &'static str,
    },
}

fn unit_factor(unit: &str) -> Option<f64> {
    UNITS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|&(_, factor)| factor)
}

/// Parses a byte size such as `"9GB"`, `"1.5 GiB"`, `"1e9"` or `"123456"`.
///
/// Fractions of a byte are rounded to the nearest byte.
pub fn parse_bytes(value: &str) -> Result<u64, UnitsError> {
    let text = value.trim();
    if text.is_empty() {
        return Err(UnitsError::Empty {
            accepted: ACCEPTED_SIZES,
        });
    }
    let invalid = |reason| UnitsError::Invalid {
        value: value.to_string(),
        reason,
        accepted: ACCEPTED_SIZES,
    };
    // The number ends where the unit's letters start; an exponent `e` followed by a digit or
    // sign belongs to the number ("1e9"), a bare `e` does not exist as a unit anyway.
    let bytes = text.as_bytes();
    let mut end = 0;
    while end < bytes.len() {
        let c = bytes[end] as char;
        let exponent = (c == 'e' || c == 'E')
            && end > 0
            && bytes
                .get(end + 1)
                .is_some_and(|n| n.is_ascii_digit() || *n == b'-' || *n == b'+');
        if c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || exponent {
            end += 1;
            if exponent {
                end += 1;
            }
        } else {
            break;
        }
    }
    let (number, unit) = text.split_at(end);
    let unit = unit.trim();
    if number.is_empty() {
        return Err(invalid("no number"));
    }
    if number.starts_with('-') {
        return Err(invalid("sizes cannot be negative"));
    }
    let n: f64 = number.parse().map_err(|_| invalid("not a number"))?;
    if !n.is_finite() {
        return Err(invalid("not a finite number"));
    }
    let factor = unit_factor(unit).ok_or_else(|| UnitsError::UnknownUnit {
        value: value.to_string(),
        unit: unit.to_string(),
        accepted: ACCEPTED_SIZES,
    })?;
    let total = (n * factor).round();
    if total < 0.0 {
        return Err(invalid("sizes cannot be negative"));
    }
    if total >= u64::MAX as f64 {
        return Err(invalid("too large"));
    }
    Ok(total as u64)
}

/// Formats bytes for people, in decimal units to match how options are written: `"5.21 GB"`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, f64); 4] = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (name, size) in UNITS {
        if bytes as f64 >= size {
            return format!("{:.2} {name}", bytes as f64 / size);
        }
    }
    format!("{bytes} B")
}

/// Formats bytes as gigabytes with two decimals and no unit, for table columns.
pub fn format_gb(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_sizes_names_every_unit_the_parser_takes() {
        let named: Vec<&str> = ACCEPTED_SIZES
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|w| UNITS.iter().any(|(u, _)| !u.is_empty() && u == w))
            .collect();
        for (unit, factor) in UNITS.iter().filter(|(u, _)| !u.is_empty()) {
            assert!(
                named.contains(unit),
                "{unit} is parsed but not named in ACCEPTED_SIZES"
            );
            let lower = format!("2{}", unit.to_ascii_lowercase());
            assert_eq!(parse_bytes(&lower), Ok((2.0 * factor) as u64), "{lower}");
        }
    }

    #[test]
    fn accepts() {
        let table: &[(&str, u64)] = &[
            ("9GB", 9_000_000_000),
            ("9 GB", 9_000_000_000),
            ("9gb", 9_000_000_000),
            ("500MB", 500_000_000),
            ("1.5GiB", 1_610_612_736),
            ("512KiB", 524_288),
            ("512 kib", 524_288),
            ("1e9", 1_000_000_000),
            ("1.5e3 MB", 1_500_000_000),
            ("123456", 123_456),
            ("0", 0),
            ("  42 B ", 42),
            ("2TiB", 2 * 1024u64.pow(4)),
            ("1TB", 1_000_000_000_000),
            ("1kB", 1000),
            ("1.5GB", 1_500_000_000),
        ];
        for (text, want) in table {
            assert_eq!(parse_bytes(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn rejects() {
        for text in [
            "",
            "  ",
            "-1",
            "-1GB",
            "NaN",
            "nan GB",
            "inf",
            "GB",
            "9 parsecs",
            "9XB",
            "1..5GB",
            "1e",
            "e9",
        ] {
            let err = parse_bytes(text).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("GiB"), "{text}: {msg}");
            if !text.trim().is_empty() {
                assert!(msg.contains(&format!("{text:?}")), "{text}: {msg}");
            }
        }
        assert!(matches!(
            parse_bytes("9 parsecs"),
            Err(UnitsError::UnknownUnit { unit, .. }) if unit == "parsecs"
        ));
        assert!(matches!(
            parse_bytes("-1GB"),
            Err(UnitsError::Invalid { .. })
        ));
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(5_210_000_000), "5.21 GB");
        assert_eq!(format_bytes(999), "999 B");
        assert_eq!(format_bytes(1_500_000), "1.50 MB");
        assert_eq!(format_gb(7_290_000_000), "7.29");
    }
}
