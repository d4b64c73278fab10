//! Edits of a plan and plans written by hand.

use std::collections::BTreeMap;

use super::blocks::{normalize_prefix, ModelBlocks};
use super::budget;
use super::near::near_names;
use super::options::{resolve_options, Figures, PlanOptions};
use super::{BlockPlan, OutsidePlan, Plan, PlanError, Tier};

/// Which blocks an edit names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Positions in the plan's block order.
    Indices(Vec<usize>),
    /// Name prefixes; each must match at least one block (`"blocks."` matches a whole list).
    Prefixes(Vec<String>),
}

impl Plan {
    /// The indices of the blocks `selector` names, checking that each entry names at least one
    /// block and that no block is named twice.
    fn select(&self, selector: &Selector) -> Result<Vec<usize>, PlanError> {
        let mut chosen: BTreeMap<usize, String> = BTreeMap::new();
        let take = |i: usize, by: String, chosen: &mut BTreeMap<usize, String>| {
            if let Some(first) = chosen.insert(i, by.clone()) {
                return Err(PlanError::NamedTwice {
                    block: self.blocks[i].name.clone(),
                    first,
                    second: by,
                });
            }
            Ok(())
        };
        match selector {
            Selector::Indices(indices) => {
                for &i in indices {
                    if i >= self.blocks.len() {
                        return Err(PlanError::IndexOutOfRange {
                            index: i,
                            count: self.blocks.len(),
                        });
                    }
                    take(i, format!("index {i}"), &mut chosen)?;
                }
            }
            Selector::Prefixes(prefixes) => {
                for raw in prefixes {
                    let p = normalize_prefix(raw)?;
                    let hits: Vec<usize> = (0..self.blocks.len())
                        .filter(|&i| self.blocks[i].name.starts_with(&p))
                        .collect();
                    if hits.is_empty() {
                        return Err(PlanError::NoBlockMatches {
                            near: near_names(&p, self.blocks.iter().map(|b| b.name.as_str())),
                            prefix: raw.clone(),
                        });
                    }
                    for i in hits {
                        take(i, raw.clone(), &mut chosen)?;
                    }
                }
            }
        }
        Ok(chosen.into_keys().collect())
    }

    /// Moves the selected blocks to `tier`, then recomputes the budgets and warnings. Nothing
    /// changes when the selector is wrong.
    pub fn assign(&mut self, tier: Tier, selector: &Selector) -> Result<(), PlanError> {
        let chosen = self.select(selector)?;
        for i in chosen {
            self.blocks[i].tier = tier;
        }
        self.recompute();
        Ok(())
    }

    /// A plan written by hand: `resident` prefixes on the device, `streamed` ones in
    /// `streamed_tier` (RAM unless told otherwise). It holds only the prefixes until
    /// [`Plan::resolve`] matches them against a model.
    pub fn manual(
        resident: &[String],
        streamed: &[String],
        streamed_tier: Tier,
    ) -> Result<Plan, PlanError> {
        let given: Vec<String> = resident.iter().chain(streamed).cloned().collect();
        let names = super::check_block_prefixes(&given)?;
        let tiers = resident
            .iter()
            .map(|_| Tier::Device)
            .chain(streamed.iter().map(|_| streamed_tier));
        let mut blocks: Vec<BlockPlan> = Vec::new();
        for (name, tier) in names.into_iter().zip(tiers) {
            blocks.push(BlockPlan {
                name,
                tier,
                stored_bytes: 0,
                file_bytes: 0,
                storage_bytes: 0,
                expanded_bytes: 0,
                staging: Default::default(),
                expansion: Default::default(),
                mapped: 0,
                tensors: 0,
                merged: false,
                image: Default::default(),
                ram_in_place: false,
                ggml: false,
            });
        }
        Ok(Plan {
            blocks,
            outside: OutsidePlan::default(),
            manual: true,
            resolved: false,
            figures: None,
            options: PlanOptions::default(),
            budgets: None,
            warnings: Vec::new(),
        })
    }

    /// Matches this plan's prefixes against `model`'s blocks (by name prefix) and computes the
    /// sizes, budgets and warnings. Every block of the model must be named exactly once. On a
    /// resolved plan, the tiers it already has are applied to the new model the same way.
    pub fn resolve(
        &self,
        model: &ModelBlocks,
        figures: &Figures,
        options: &PlanOptions,
    ) -> Result<Plan, PlanError> {
        let options = &resolve_options(options, model)?;
        let gpu = figures.free_vram.is_some();
        let mut tiers: Vec<Option<(Tier, &str)>> = vec![None; model.blocks.len()];
        for entry in &self.blocks {
            let mut hit = false;
            for (i, block) in model.blocks.iter().enumerate() {
                if !block.name.starts_with(&entry.name) {
                    continue;
                }
                hit = true;
                if let Some((_, first)) = tiers[i] {
                    return Err(PlanError::NamedTwice {
                        block: block.name.clone(),
                        first: first.to_string(),
                        second: entry.name.clone(),
                    });
                }
                tiers[i] = Some((entry.tier, entry.name.as_str()));
            }
            if !hit {
                return Err(PlanError::NoBlockMatches {
                    prefix: entry.name.clone(),
                    near: near_names(&entry.name, model.blocks.iter().map(|b| b.name.as_str())),
                });
            }
        }
        let unassigned: Vec<String> = model
            .blocks
            .iter()
            .zip(&tiers)
            .filter(|(_, t)| t.is_none())
            .map(|(b, _)| b.name.clone())
            .collect();
        if !unassigned.is_empty() {
            return Err(PlanError::Unassigned {
                count: unassigned.len(),
                names: unassigned.into_iter().take(5).collect(),
            });
        }
        let blocks = model
            .blocks
            .iter()
            .zip(tiers)
            .map(|(b, t)| {
                let mut plan = budget::block_plan(&b.name, &b.tensors, options, gpu);
                plan.tier = t.map_or(Tier::Device, |(tier, _)| tier);
                plan
            })
            .collect();
        let outside = budget::outside_plan(model, options);
        Ok(Plan::resolved_with(
            blocks,
            outside,
            self.manual,
            figures,
            options,
        ))
    }
}
