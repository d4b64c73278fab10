//! What a batch of reads moved, how long it took and how it read.

use std::ops::{Add, AddAssign};

use super::ReadMode;

/// Bytes read, wall-clock seconds, and the mode that did the reading.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadStats {
    /// Bytes read.
    pub bytes: u64,
    /// Wall-clock seconds the reads took.
    pub seconds: f64,
    /// How the bytes were read.
    pub mode: ReadMode,
}

impl ReadStats {
    /// Stats from their figures.
    pub fn new(bytes: u64, seconds: f64, mode: ReadMode) -> Self {
        ReadStats {
            bytes,
            seconds,
            mode,
        }
    }

    /// Throughput in GB/s (10^9 bytes), 0 when no time was measured.
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / 1e9 / self.seconds
        } else {
            0.0
        }
    }
}

/// Sums bytes and seconds (batches run one after another). The mode is `Direct` only if both
/// batches read direct, so a fallback anywhere stays visible in the total.
impl Add for ReadStats {
    type Output = ReadStats;
    fn add(self, rhs: ReadStats) -> ReadStats {
        let mode = if self.mode == ReadMode::Direct && rhs.mode == ReadMode::Direct {
            ReadMode::Direct
        } else {
            ReadMode::Buffered
        };
        ReadStats::new(self.bytes + rhs.bytes, self.seconds + rhs.seconds, mode)
    }
}

impl AddAssign for ReadStats {
    fn add_assign(&mut self, rhs: ReadStats) {
        *self = *self + rhs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up() {
        let mut s = ReadStats::new(2_000_000_000, 1.0, ReadMode::Direct);
        assert_eq!(s.gb_per_s(), 2.0);
        s += ReadStats::new(1_000_000_000, 2.0, ReadMode::Direct);
        assert_eq!(
            (s.bytes, s.seconds, s.mode),
            (3_000_000_000, 3.0, ReadMode::Direct)
        );
        assert_eq!(s.gb_per_s(), 1.0);
        let t = s + ReadStats::new(0, 0.0, ReadMode::Buffered);
        assert_eq!(t.mode, ReadMode::Buffered);
        assert_eq!(ReadStats::new(5, 0.0, ReadMode::Direct).gb_per_s(), 0.0);
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"buffered\""), "{json}");
    }
}
