//! A loaded stage's blocks as its plan counts them: which it gives back when another stage
//! needs memory ([`give_back`]), which of some blocks hold memory it could give and how much
//! ([`resident_among`]), what each read of its loader holds once done ([`read_costs`]), and in
//! which memory its blocks compute ([`Holds::on_device`](super::Holds::on_device)).
//!
//! A resident block holds its stored bytes; a block in RAM or on disk holds none of the memory
//! a stage gives block by block (a RAM tier read into memory is counted, and given back, whole).

use crate::engine_config::EngineConfig;
use crate::plan::Plan;
use crate::rules::Tier;
use crate::stream::RamSource;

/// Blocks (by prefix) and the bytes they hold, as their plan counts them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shed {
    /// The blocks' prefixes, in the order chosen.
    pub blocks: Vec<String>,
    /// Their bytes together.
    pub bytes: u64,
}

/// What block `prefix` holds once loaded, as `plan` counts it: its stored bytes when it is
/// resident; `None` for a block in RAM or on disk, or one the plan does not name.
fn resident_bytes(plan: &Plan, prefix: &str) -> Option<u64> {
    plan.blocks
        .iter()
        .find(|b| b.name == prefix && b.tier == Tier::Device)
        .map(|b| b.stored_bytes)
}

/// The resident blocks among `blocks` (prefixes, in their order) and the bytes they hold: what
/// a final pass freed that counts as given back, what a stage could still give.
pub fn resident_among(plan: &Plan, blocks: &[String]) -> Shed {
    let mut shed = Shed::default();
    for b in blocks {
        if let Some(n) = resident_bytes(plan, b) {
            shed.blocks.push(b.clone());
            shed.bytes += n;
        }
    }
    shed
}

/// Which blocks a stage loaded by `plan` gives back so that `ask` bytes are free, `counted` of
/// them free already: its resident blocks not given back yet (`gone`), those that run last
/// first (`run_order`: every block's prefix in the order they run), until their bytes and
/// `counted` cover `ask`. The next run reads them again behind its first blocks' compute.
pub fn give_back(
    plan: &Plan,
    run_order: &[String],
    gone: &[String],
    ask: u64,
    counted: u64,
) -> Shed {
    let mut shed = Shed::default();
    for b in run_order.iter().rev() {
        if counted.saturating_add(shed.bytes) >= ask {
            break;
        }
        if gone.contains(b) {
            continue;
        }
        if let Some(n) = resident_bytes(plan, b) {
            shed.blocks.push(b.clone());
            shed.bytes += n;
        }
    }
    shed
}

/// What each read of a stage's loader holds once done, as its plan counts it (what the stage's
/// [`Holds`](super::Holds) adds up, and what each read takes from an allowance).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadCosts {
    /// Each block asked about, in the order asked: its stored bytes when resident, else 0.
    pub blocks: Vec<u64>,
    /// The weights outside the blocks, read by the loader: their budget (0 when the loader
    /// reads none of them, or the plan has no budgets).
    pub outside: u64,
    /// A RAM tier read into memory by the loader (on the CPU, where it is the memory the blocks
    /// compute in): each RAM-tier block's staged bytes; 0 otherwise.
    pub ram_tier: u64,
}

/// What the loader's reads of `blocks` (prefixes) hold once done, with the weights outside the
/// blocks when it reads some of them (`outside`), and the RAM tier when it reads that too
/// (`ram_tier`: a stage read ahead), for a stage loaded by `plan` and configured as `config`,
/// computing on a GPU when `gpu`. A RAM tier counts only read into memory (a mapped one is the
/// page cache) and without a GPU (with one, it is not device memory, which the costs count).
pub fn read_costs(
    plan: &Plan,
    config: &EngineConfig,
    blocks: &[String],
    outside: bool,
    ram_tier: bool,
    gpu: bool,
) -> ReadCosts {
    let in_memory = matches!(config.ram_source, RamSource::InMemory { .. });
    ReadCosts {
        blocks: blocks
            .iter()
            .map(|b| resident_bytes(plan, b).unwrap_or(0))
            .collect(),
        outside: match &plan.budgets {
            Some(b) if outside => b.outside,
            _ => 0,
        },
        ram_tier: if ram_tier && in_memory && !gpu {
            plan.blocks
                .iter()
                .filter(|b| b.tier == Tier::Ram)
                .map(|b| b.staging.get(Tier::Ram))
                .sum()
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::engine_config::{EngineConfigError, EngineSettings};
    use crate::plan::{plan, Figures, ModelBlocks, PlanOptions};
    use crate::rules::{maps_disk_tier, TensorSizes};

    /// Six blocks of 4 MiB (f32 1024x1024), the first `resident` on the device, the rest in RAM.
    fn planned(resident: usize) -> Plan {
        planned_with(resident, PlanOptions::default())
    }

    fn planned_with(resident: usize, options: PlanOptions) -> Plan {
        let mut ts = vec![TensorSizes::new("embed.weight", DType::F32, &[64, 64])];
        for i in 0..6 {
            ts.push(TensorSizes::new(
                format!("layers.{i}.w.weight"),
                DType::F32,
                &[1024, 1024],
            ));
        }
        let mut p = plan(
            &ModelBlocks::discover(ts),
            &Figures::injected(1 << 34, None),
            &options,
        )
        .unwrap();
        for (i, b) in p.blocks.iter_mut().enumerate() {
            if i >= resident {
                b.tier = Tier::Ram;
            }
        }
        p
    }

    fn names(n: &[usize]) -> Vec<String> {
        n.iter().map(|i| format!("layers.{i}.")).collect()
    }

    const BLOCK: u64 = 4 << 20;

    #[test]
    fn the_blocks_run_last_go_first_until_the_ask_is_covered() {
        let p = planned(4);
        assert_eq!(p.blocks[0].stored_bytes, BLOCK);
        let order = names(&[0, 1, 2, 3, 4, 5]);
        // Blocks 4 and 5 are in RAM: they hold nothing a stage gives block by block.
        let got = give_back(&p, &order, &[], BLOCK + 1, 0);
        assert_eq!(got.blocks, names(&[3, 2]));
        assert_eq!(got.bytes, 2 * BLOCK);
        // Given back already: passed over; what is counted free already lowers the ask.
        let got = give_back(&p, &order, &names(&[3]), BLOCK + 1, 1);
        assert_eq!((got.blocks, got.bytes), (names(&[2]), BLOCK));
        // Another run order: the block it runs last is its first in plan order.
        let got = give_back(&p, &names(&[1, 2, 3, 0]), &[], 1, 0);
        assert_eq!(got.blocks, names(&[0]));
        // Nothing asked beyond what is counted: nothing given; more than all: all of them.
        assert_eq!(give_back(&p, &order, &[], 5, 5), Shed::default());
        assert_eq!(give_back(&p, &order, &[], u64::MAX, 0).bytes, 4 * BLOCK);
    }

    #[test]
    fn only_resident_blocks_count_among_those_asked_about() {
        let p = planned(2);
        let got = resident_among(&p, &names(&[5, 1, 3, 0]));
        assert_eq!((got.blocks, got.bytes), (names(&[1, 0]), 2 * BLOCK));
        let unknown = resident_among(&p, &["elsewhere.".to_string()]);
        assert_eq!(unknown, Shed::default());
    }

    #[test]
    fn a_loader_s_reads_cost_what_the_plan_counts() {
        let p = planned(2);
        let settings = EngineSettings::resolve(|_| None).unwrap();
        let config = EngineConfig::from_plan(&p, &settings).unwrap();
        let outside = p.budgets.as_ref().unwrap().outside;
        assert!(outside > 0);
        let got = read_costs(&p, &config, &names(&[0, 4]), true, true, false);
        assert_eq!(got.blocks, [BLOCK, 0]);
        assert_eq!(got.outside, outside);
        // A mapped RAM tier is the page cache: it costs nothing.
        assert!(matches!(config.ram_source, RamSource::Mapped));
        assert_eq!(got.ram_tier, 0);
        assert_eq!(read_costs(&p, &config, &[], false, true, false).outside, 0);
        // Read into memory, on the CPU, by a stage read ahead: its staged bytes. The plan is
        // made for it: one made for a mapped RAM tier counted no staging for blocks run in place.
        let in_memory =
            EngineSettings::resolve(|k| (k == "TRASH_PANDA_RAM_IN_MEMORY").then(|| "1".into()))
                .unwrap();
        if maps_disk_tier(false) {
            assert!(matches!(
                EngineConfig::from_plan(&p, &in_memory),
                Err(EngineConfigError::RamTierPlannedMapped { blocks: 4 })
            ));
        }
        let options = PlanOptions {
            ram_in_memory: true,
            ..PlanOptions::default()
        };
        let p = planned_with(2, options);
        let config = EngineConfig::from_plan(&p, &in_memory).unwrap();
        let staged: u64 = p.blocks[2..].iter().map(|b| b.staging.get(Tier::Ram)).sum();
        assert!(staged >= 4 * BLOCK);
        assert_eq!(
            read_costs(&p, &config, &[], false, true, false).ram_tier,
            staged
        );
        assert_eq!(
            read_costs(&p, &config, &[], false, false, false).ram_tier,
            0
        );
        assert_eq!(read_costs(&p, &config, &[], false, true, true).ram_tier, 0);
    }
}
