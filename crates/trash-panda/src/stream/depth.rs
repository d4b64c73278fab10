//! The staging depth that follows the profile: how many blocks ahead of the one that runs the
//! workers stage, per place in the run order.
//!
//! Every block has a lead: how many blocks before it runs its staging is queued. It starts at the
//! plan's look-ahead. When the compute had to wait for a block (its `acquire` found it not
//! staged), the block's lead grows by one, so next pass its staging starts one block earlier; after
//! [`CALM_PASSES`] passes in a row without such a wait it comes back down one step, toward the
//! look-ahead. The depth the window is planned with after a block runs is the farthest block
//! ahead whose lead reaches back to it (the window is contiguous: nearer blocks are needed sooner
//! anyway). Leads never pass the cap, [`crate::rules::depth_cap`]: the staging buffers the plan
//! counted, less the one that runs, so growing takes no memory the plan did not count. Without a
//! maximum above the look-ahead the cap is the look-ahead and the depth is fixed, as it always was.
//!
//! The rule reads only whether an acquire waited, never how long, so the same run order and the
//! same misses give the same depths: the profile can say why each one changed.

use crate::profile::{DepthChange, DepthPass};

/// Passes in a row without a wait for a block before its lead comes down one step. More than one,
/// so a block that waits every other pass does not swing back and forth each pass.
pub(crate) const CALM_PASSES: u32 = 2;

/// The per-block leads and the record of each pass's depths.
#[derive(Debug)]
pub(crate) struct Depth {
    /// The plan's look-ahead: no lead is ever below it.
    base: usize,
    /// The deepest any lead goes (see [`crate::rules::depth_cap`]).
    cap: usize,
    lead: Vec<usize>,
    /// Passes in a row each block was acquired without waiting.
    calm: Vec<u32>,
    /// Run-order position of the block acquired last, to see where a pass starts.
    last_pos: Option<usize>,
    /// One entry per pass since the last reset, the pass under way last.
    passes: Vec<DepthPass>,
    /// Passes counted before the last reset, so pass numbers go on across resets.
    passes_before: usize,
}

impl Depth {
    pub fn new(blocks: usize, base: usize, cap: usize) -> Depth {
        let cap = cap.max(base);
        Depth {
            base,
            cap,
            lead: vec![base; blocks],
            calm: vec![0; blocks],
            last_pos: None,
            passes: Vec::new(),
            passes_before: 0,
        }
    }

    /// Whether the depth can change at all (a maximum above the look-ahead was counted).
    pub fn grows(&self) -> bool {
        self.cap > self.base
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The depth to plan the window with after a block whose next blocks in the run order (up
    /// to the cap, nearest first) are `ahead`: the farthest one whose lead reaches back here,
    /// and never less than the look-ahead.
    pub fn window(&self, ahead: impl Iterator<Item = usize>) -> usize {
        ahead
            .enumerate()
            .filter(|&(k, b)| self.lead[b] > k)
            .map(|(k, _)| k + 1)
            .fold(self.base, usize::max)
    }

    /// Counts an acquire of `block` (at run-order position `pos`, named `name`) that planned
    /// the window `used` blocks deep and waited `waited` seconds for the block (`None`: it was
    /// staged already), and moves the block's lead by the rule above.
    pub fn note(&mut self, block: usize, pos: usize, name: &str, used: usize, waited: Option<f64>) {
        if !self.grows() {
            return;
        }
        let new_pass = self.last_pos.is_none_or(|last| pos <= last) || self.passes.is_empty();
        self.last_pos = Some(pos);
        if new_pass {
            let pass = self.passes_before + self.passes.len();
            self.passes.push(DepthPass {
                pass,
                min: used,
                max: used,
                changes: Vec::new(),
            });
        }
        let from = self.lead[block];
        let change = match waited {
            Some(seconds) => {
                self.calm[block] = 0;
                (from < self.cap).then(|| DepthChange {
                    block: name.to_owned(),
                    from,
                    to: from + 1,
                    waited_seconds: seconds,
                    calm_passes: 0,
                })
            }
            None => {
                self.calm[block] += 1;
                (self.calm[block] >= CALM_PASSES && from > self.base).then(|| {
                    self.calm[block] = 0;
                    DepthChange {
                        block: name.to_owned(),
                        from,
                        to: from - 1,
                        waited_seconds: 0.0,
                        calm_passes: CALM_PASSES,
                    }
                })
            }
        };
        let pass = self.passes.last_mut().expect("a pass was started above");
        pass.min = pass.min.min(used);
        pass.max = pass.max.max(used);
        if let Some(c) = change {
            self.lead[block] = c.to;
            pass.changes.push(c);
        }
    }

    /// The record of each pass since the last reset.
    pub fn passes(&self) -> &[DepthPass] {
        &self.passes
    }

    /// Forgets the record (the leads stay: they are what the runs so far taught).
    pub fn reset(&mut self) {
        self.passes_before += self.passes.len();
        self.passes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `passes` passes over blocks 0..n in order; `waits(pass, block)` says whether the
    /// acquire waited. Returns the depth used after each block, per pass.
    fn drive(d: &mut Depth, n: usize, passes: usize, waits: impl Fn(usize, usize) -> bool) {
        for pass in 0..passes {
            for b in 0..n {
                let ahead = (1..=d.cap()).map(|k| (b + k) % n);
                let used = d.window(ahead);
                let waited = waits(pass, b).then_some(0.25);
                d.note(b, b, &format!("blocks.{b}"), used, waited);
            }
        }
    }

    #[test]
    fn a_wait_starts_that_block_earlier_next_pass_up_to_the_cap() {
        let mut d = Depth::new(8, 2, 4);
        // Block 5 waits in each of the first four passes.
        drive(&mut d, 8, 4, |pass, b| b == 5 && pass < 4);
        assert_eq!(d.lead[5], 4, "one step per wait, stopped at the cap");
        assert!(d.lead.iter().enumerate().all(|(b, &l)| b == 5 || l == 2));
        let p = d.passes();
        assert_eq!(p.len(), 4);
        assert_eq!((p[0].min, p[0].max), (2, 2));
        // Pass 2: block 5 is queued three ahead, after block 2.
        assert_eq!((p[1].min, p[1].max), (2, 3));
        assert_eq!((p[2].min, p[2].max), (2, 4));
        assert_eq!(
            p[0].changes[0].reason(),
            "grew to 3 before blocks.5 after a 0.25 s wait"
        );
        assert_eq!(p[1].changes[0].to, 4);
        assert!(
            p[2].changes.is_empty() && p[3].changes.is_empty(),
            "at the cap a wait changes nothing"
        );
        // The window after block 1 reaches block 5 (four ahead), and never past the cap.
        assert_eq!(d.window((2..=5).map(|k| k % 8)), 4);
        assert_eq!(d.window((3..=6).map(|k| k % 8)), 3);
    }

    #[test]
    fn passes_without_waits_bring_the_depth_back_to_the_look_ahead() {
        let mut d = Depth::new(6, 1, 3);
        drive(&mut d, 6, 2, |_, b| b == 4);
        assert_eq!(d.lead[4], 3);
        d.reset();
        drive(&mut d, 6, 5, |_, _| false);
        let changes: Vec<(usize, usize, usize)> = d
            .passes()
            .iter()
            .flat_map(|p| p.changes.iter().map(move |c| (p.pass, c.from, c.to)))
            .collect();
        // One step down after every two calm passes; pass numbers go on across the reset.
        assert_eq!(changes, [(3, 3, 2), (5, 2, 1)]);
        assert_eq!(d.lead[4], 1);
        assert_eq!(
            d.passes()[1].changes[0].reason(),
            "shrank to 2 before blocks.4: no waits for 2 passes"
        );
        let last = d.passes().last().unwrap();
        assert_eq!((last.min, last.max), (1, 1));
    }

    #[test]
    fn a_wait_resets_the_calm_count() {
        let mut d = Depth::new(4, 1, 2);
        // Waits in passes 0 and 2: the calm pass between them is not enough to shrink.
        drive(&mut d, 4, 4, |pass, b| b == 2 && pass % 2 == 0);
        assert_eq!(d.lead[2], 2);
        assert!(d
            .passes()
            .iter()
            .flat_map(|p| &p.changes)
            .all(|c| c.to > c.from));
    }

    #[test]
    fn without_a_maximum_the_depth_is_fixed() {
        let mut d = Depth::new(5, 2, 2);
        assert!(!d.grows());
        drive(&mut d, 5, 3, |_, _| true);
        assert!(
            d.passes().is_empty(),
            "nothing recorded: the profile reads as before"
        );
        assert!(d.lead.iter().all(|&l| l == 2));
        assert_eq!(d.window((1..=2).map(|k| k % 5)), 2);
        // A cap below the look-ahead is raised to it: the depth never shrinks below the plan's.
        assert_eq!(Depth::new(3, 2, 0).cap(), 2);
    }
}
