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
    /// The tier's own name, lower-case, as plans, logs and options write it.
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Ram => "ram",
            Tier::Disk => "disk",
        }
    }

    /// The tier a name (or one of its [`TIER_NAMES`] aliases) stands for, in any case; `None` for
    /// any other name.
    pub fn parse(s: &str) -> Option<Tier> {
        let s = s.trim().to_ascii_lowercase();
        TIER_NAMES
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, tier)| *tier)
    }
}

/// Every name a tier is accepted under: its own name first, then its aliases.
pub const TIER_NAMES: [(&str, Tier); 8] = [
    ("device", Tier::Device),
    ("gpu", Tier::Device),
    ("cuda", Tier::Device),
    ("vram", Tier::Device),
    ("ram", Tier::Ram),
    ("cpu", Tier::Ram),
    ("memory", Tier::Ram),
    ("disk", Tier::Disk),
];

/// The aliases of the tiers, for error messages: `gpu, cuda, vram, cpu, memory`.
pub fn tier_aliases() -> String {
    TIER_NAMES
        .iter()
        .filter(|(name, tier)| *name != tier.name())
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A figure for each tier a block can be in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByTier {
    /// The figure for a block on the device tier.
    pub device: u64,
    /// The figure for a block on the RAM tier.
    pub ram: u64,
    /// The figure for a block on the disk tier.
    pub disk: u64,
}

impl ByTier {
    /// The figure for `tier`.
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
        assert_eq!(tier_aliases(), "gpu, cuda, vram, cpu, memory");
        let figures = ByTier {
            device: 1,
            ram: 2,
            disk: 3,
        };
        assert_eq!(figures.get(Tier::Ram), 2);
        assert_eq!(figures.streamed(), 3);
    }
}
