//! Which way a streamed layer runs its adapter: merged into the weight or beside it.
//!
//! A streamed layer's weight arrives on each run. Its adapter can be merged into it (a copy of
//! the weight plus `ΔW`), once if the merge can be kept until the next run, or again on each
//! run if it cannot; or run unmerged, `y = W x + s·B(A x)`, on each call. Kept, a merge costs
//! nothing after the first run, and wins unless the runs left are few. Otherwise the choice is
//! a race between two per-run costs:
//!
//! - a merge touches the whole weight: `out × in` elements copied and added to, and `ΔW` built
//!   (`2·rank·out·in` multiply-adds for a LoRA);
//! - unmerged, a LoRA costs `2·rank·(in + out)` multiply-adds per token, and its two small
//!   products and the add into the result touch `tokens × (in + out)` values; a LoHa or LoKr
//!   unmerged builds its whole `ΔW` on each call and multiplies the tokens by it, which costs
//!   more than a merge from about a hundred tokens a call.
//!
//! Work is counted in multiply-adds, with each value a memory-bound operation touches counted as
//! [`TOUCH_COST`] of them: a rough balance between arithmetic and memory on CPUs and GPUs alike,
//! which puts the crossing where it was measured on an AVX-512 CPU (a rank-16 LoRA on a
//! 1024 x 4096 bf16 layer: merging on each run wins from a few thousand tokens a call).

use super::AdapterKind;

/// Multiply-adds one value a memory-bound pass touches is worth (read, write, add).
pub const TOUCH_COST: u64 = 32;

/// The way a streamed layer runs its adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterWay {
    /// Merged into the weight on its first run and kept for the next ones.
    MergedKept,
    /// Merged into the weight again on each run (no room to keep it).
    MergedEachRun,
    /// Beside the weight, on each call.
    Unmerged,
}

impl AdapterWay {
    /// The way's name: `merged_kept`, `merged_each_run` or `unmerged`.
    pub const fn name(self) -> &'static str {
        match self {
            AdapterWay::MergedKept => "merged_kept",
            AdapterWay::MergedEachRun => "merged_each_run",
            AdapterWay::Unmerged => "unmerged",
        }
    }
}

/// What one layer's run asks of its adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerWork {
    /// The patch's kind.
    pub kind: AdapterKind,
    /// Its rank (0 for a LoKr of whole factors).
    pub rank: u64,
    /// The layer's input features (channels times kernel elements for a convolution).
    pub in_features: u64,
    /// Its output features.
    pub out_features: u64,
    /// Tokens (rows of the input; output pixels for a convolution) in one call.
    pub tokens: u64,
    /// Calls of the layer in one run of its block.
    pub calls: u64,
}

/// The way chosen for a layer, why, and the per-run costs compared (in multiply-adds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WayChoice {
    /// The way.
    pub way: AdapterWay,
    /// Why, in words for a report.
    pub why: String,
    /// What merging costs on a run (once, when kept).
    pub merge_cost: u64,
    /// What running the adapter unmerged costs on a run.
    pub unmerged_cost: u64,
}

/// What merging the adapter into the weight costs once: `ΔW` built, the weight copied and added
/// to.
pub fn merge_cost(work: &LayerWork) -> u64 {
    let elements = work.out_features.saturating_mul(work.in_features);
    let build = match work.kind {
        AdapterKind::Lora => 2u64.saturating_mul(work.rank).saturating_mul(elements),
        // Two factors multiplied out (or whole) and combined, element by element.
        AdapterKind::Loha | AdapterKind::Lokr => {
            let products = 2u64
                .saturating_mul(work.rank.max(1))
                .saturating_mul(elements);
            products.saturating_add(elements.saturating_mul(TOUCH_COST))
        }
    };
    build.saturating_add(elements.saturating_mul(3 * TOUCH_COST))
}

/// What running the adapter beside the weight costs on one run of the layer's block.
pub fn unmerged_cost(work: &LayerWork) -> u64 {
    let tokens = work.tokens.saturating_mul(work.calls.max(1));
    let width = work.in_features.saturating_add(work.out_features);
    match work.kind {
        AdapterKind::Lora => {
            let products = 2u64
                .saturating_mul(work.rank)
                .saturating_mul(tokens)
                .saturating_mul(width);
            products.saturating_add(tokens.saturating_mul(width).saturating_mul(TOUCH_COST))
        }
        // The whole ΔW built on each call, then the tokens multiplied by it.
        AdapterKind::Loha | AdapterKind::Lokr => {
            let elements = work.out_features.saturating_mul(work.in_features);
            let once = merge_cost(work).saturating_sub(elements.saturating_mul(3 * TOUCH_COST));
            let product = tokens.saturating_mul(elements);
            once.saturating_mul(work.calls.max(1))
                .saturating_add(product)
        }
    }
}

/// Chooses the way for a layer: kept merged where the merge can be kept and more than one run
/// is left (`runs_left` `None`: not known, so many); otherwise whichever of merging on each
/// run and running unmerged costs less per run, as the model above counts.
pub fn choose_way(work: &LayerWork, can_keep: bool, runs_left: Option<u64>) -> WayChoice {
    let (merge, unmerged) = (merge_cost(work), unmerged_cost(work));
    let many = runs_left.is_none_or(|r| r > 1);
    let (way, why) = if can_keep && many {
        (
            AdapterWay::MergedKept,
            "merged once and kept: later runs cost what they cost without the adapter".to_owned(),
        )
    } else {
        let room = if can_keep {
            "one run left"
        } else {
            "no room to keep a merge"
        };
        let tokens = work.tokens.saturating_mul(work.calls.max(1));
        if merge < unmerged {
            let why = format!(
                "merged on each run ({room}): merging costs {:.2} of running it unmerged at {tokens} tokens a run",
                merge as f64 / unmerged.max(1) as f64
            );
            (AdapterWay::MergedEachRun, why)
        } else {
            let why = format!(
                "unmerged ({room}): running it beside the weight costs {:.2} of merging at {tokens} tokens a run",
                unmerged as f64 / merge.max(1) as f64
            );
            (AdapterWay::Unmerged, why)
        }
    };
    WayChoice {
        way,
        why,
        merge_cost: merge,
        unmerged_cost: unmerged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lora(tokens: u64) -> LayerWork {
        LayerWork {
            kind: AdapterKind::Lora,
            rank: 16,
            in_features: 1024,
            out_features: 4096,
            tokens,
            calls: 1,
        }
    }

    #[test]
    fn a_kept_merge_wins_unless_one_run_is_left() {
        assert_eq!(choose_way(&lora(1), true, None).way, AdapterWay::MergedKept);
        assert_eq!(
            choose_way(&lora(1), true, Some(2)).way,
            AdapterWay::MergedKept
        );
        // One run left: the race between the per-run costs decides.
        assert_eq!(
            choose_way(&lora(1), true, Some(1)).way,
            AdapterWay::Unmerged
        );
        assert_eq!(
            choose_way(&lora(100_000), true, Some(1)).way,
            AdapterWay::MergedEachRun
        );
    }

    #[test]
    fn a_lora_runs_unmerged_for_few_tokens_and_merges_for_many() {
        let crossing = (1..1_000_000u64)
            .find(|&t| choose_way(&lora(t), false, None).way == AdapterWay::MergedEachRun)
            .unwrap();
        // Measured on an AVX-512 CPU: unmerged cheaper at 512 tokens, merging at 8192.
        assert!((512..8192).contains(&crossing), "{crossing}");
        // More calls a run count as more tokens; a bigger rank costs both ways.
        let twice = LayerWork {
            calls: 2,
            ..lora(crossing / 2 + 1)
        };
        assert_eq!(
            choose_way(&twice, false, None).way,
            AdapterWay::MergedEachRun
        );
        let c = choose_way(&lora(10), false, None);
        assert!(
            c.why.starts_with("unmerged (no room to keep a merge)"),
            "{}",
            c.why
        );
        assert!(c.unmerged_cost < c.merge_cost);
    }

    #[test]
    fn loha_and_lokr_merge_from_a_hundred_tokens() {
        for kind in [AdapterKind::Loha, AdapterKind::Lokr] {
            let way = |tokens| {
                choose_way(
                    &LayerWork {
                        kind,
                        ..lora(tokens)
                    },
                    false,
                    None,
                )
                .way
            };
            // Building ΔW costs the same both ways; the weight's copy against the tokens' product.
            assert_eq!(way(1), AdapterWay::Unmerged, "{kind:?}");
            for tokens in [128, 4096, 100_000] {
                assert_eq!(way(tokens), AdapterWay::MergedEachRun, "{kind:?} {tokens}");
            }
        }
    }

    #[test]
    fn huge_layers_do_not_overflow() {
        let work = LayerWork {
            rank: u64::MAX,
            in_features: u64::MAX,
            out_features: u64::MAX,
            tokens: u64::MAX,
            calls: u64::MAX,
            ..lora(1)
        };
        let c = choose_way(&work, false, Some(0));
        assert_eq!((c.merge_cost, c.unmerged_cost), (u64::MAX, u64::MAX));
    }
}
