//! The tiers a block's weights can live in between uses, and their names.

use serde::{Deserialize, Serialize};

/// Where a block's weights live between uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Resident on the compute device (the GPU, or the CPU's RAM when there is no GPU).
    Device,
    /// Kept in host RAM and copied to the device ahead of use.
    Ram,
    /// Read from the checkpoint file ahead of use.
    Disk,
}

impl Tier {
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Ram => "ram",
            Tier::Disk => "disk",
        }
    }

    /// The tier a name (or one of its aliases: `gpu`, `cuda`, `vram`; `cpu`, `memory`) stands
    /// for, in any case; `None` for any other name.
    pub fn parse(s: &str) -> Option<Tier> {
        match s.trim().to_ascii_lowercase().as_str() {
            "device" | "gpu" | "cuda" | "vram" => Some(Tier::Device),
            "ram" | "cpu" | "memory" => Some(Tier::Ram),
            "disk" => Some(Tier::Disk),
            _ => None,
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A figure for each tier a block can be in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByTier {
    pub device: u64,
    pub ram: u64,
    pub disk: u64,
}

impl ByTier {
    pub fn get(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Device => self.device,
            Tier::Ram => self.ram,
            Tier::Disk => self.disk,
        }
    }

    /// The larger of the two streamed tiers: what a block may need before its tier is decided.
    pub fn streamed(&self) -> u64 {
        self.ram.max(self.disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_is_known_by_its_name_and_aliases() {
        for tier in [Tier::Device, Tier::Ram, Tier::Disk] {
            assert_eq!(Tier::parse(tier.name()), Some(tier));
        }
        assert_eq!(Tier::parse(" GPU "), Some(Tier::Device));
        assert_eq!(Tier::parse("memory"), Some(Tier::Ram));
        assert_eq!(Tier::parse("tape"), None);
        let figures = ByTier {
            device: 1,
            ram: 2,
            disk: 3,
        };
        assert_eq!(figures.get(Tier::Ram), 2);
        assert_eq!(figures.streamed(), 3);
    }
}
