//! Expanding a leased block's staged tensors into destinations the caller owns (the CPU
//! backend's compute-dtype tensors): which tensors expand, with which scale and layout, and the
//! checks that make writing the destinations sound (each the size of its tensor's expansion,
//! none overlapping another or the staged block it reads).
//!
//! [`Expansion::plan`] decides and checks from addresses alone, before any destination is
//! borrowed as a mutable slice; [`Expansion::run`] converts.

use std::ops::Range;

use crate::dtype::{self, rows_cols, DType, DtypeError, ScaleLayout};
use crate::rules::StagedTensor;
use crate::stream::{Lease, StreamError, TENSOR_ALIGN};

use super::{leased_scale, staged_work, ScaleReadError, ScaleSource, TensorWork};

/// Why an expansion into destinations was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    /// A destination names a tensor the block does not hold.
    #[error("expand_into: no tensor #{index} in the block")]
    NoTensor {
        /// The index given, past the block's layout.
        index: usize,
    },
    /// A destination is not the size of its tensor's expansion.
    #[error("expand_into: the destination of {tensor} holds {len} bytes, expected {want}")]
    WrongSize {
        /// The tensor's name.
        tensor: String,
        /// Bytes the destination holds.
        len: usize,
        /// Bytes of the tensor's elements in the compute dtype.
        want: usize,
    },
    /// A destination overlaps the staged block the expansion reads.
    #[error("expand_into: the destination of {tensor} overlaps the staged block it reads")]
    OverlapsStaged {
        /// The tensor's name.
        tensor: String,
    },
    /// Two destinations share memory.
    #[error("expand_into: two destinations overlap")]
    Overlap,
    /// The destinations given to [`Expansion::run`] are not those it was planned for.
    #[error("expand_into: {given} destinations given, {planned} planned")]
    NotPlanned {
        /// Destinations given to `run`.
        given: usize,
        /// Destinations `plan` checked.
        planned: usize,
    },
    /// The block's scales could not be paired with its weights.
    #[error(transparent)]
    Work(DtypeError),
    /// A tensor's scale could not be read from the lease.
    #[error(transparent)]
    Scale(#[from] ScaleReadError),
    /// A tensor's staged bytes could not be read from the lease.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// A tensor could not be converted to the compute dtype.
    ///
    /// What to do: the message after the tensor's name says what the conversion refused (a
    /// dtype or a scale shape it does not take); the checkpoint is of a kind the library does
    /// not expand. Report it with the model's name.
    #[error("tensor {tensor}: {source}")]
    Convert {
        /// The tensor's name.
        tensor: String,
        /// Why the conversion failed.
        #[source]
        source: DtypeError,
    },
}

impl ExpandError {
    /// Whether the caller's arguments were refused (rather than a conversion failing).
    pub fn is_argument(&self) -> bool {
        matches!(
            self,
            ExpandError::NoTensor { .. }
                | ExpandError::WrongSize { .. }
                | ExpandError::OverlapsStaged { .. }
                | ExpandError::Overlap
                | ExpandError::NotPlanned { .. }
        )
    }
}

/// One tensor to expand: its index in the block's layout and the address range of its
/// destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandTarget {
    /// The tensor's index in the block's layout.
    pub tensor: usize,
    /// The destination's addresses (start..end); an empty range touches no memory.
    pub span: Range<usize>,
}

/// What one target expands: the tensor, its dtypes and shape, and the scale applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandStep {
    /// The tensor's index in the block's layout.
    pub tensor: usize,
    /// The scale and how it is laid out (`None`: a plain cast).
    pub scale: Option<(ScaleSource, ScaleLayout)>,
}

/// A checked expansion of some of a block's tensors into the compute dtype.
#[derive(Debug, Clone)]
pub struct Expansion {
    to: DType,
    work: Vec<TensorWork>,
    steps: Vec<ExpandStep>,
    spans: Vec<Range<usize>>,
}

impl Expansion {
    /// Checks `targets` against the block's `layout` (staged at the addresses `staged`) for an
    /// expansion to `to`: each names a tensor of the layout, is exactly the tensor's elements in
    /// `to`, and overlaps neither the staged block nor another target. The scale of each comes
    /// from the block's [`staged_work`] at the stream engine's alignment.
    pub fn plan(
        layout: &[StagedTensor],
        staged: Range<usize>,
        targets: &[ExpandTarget],
        to: DType,
    ) -> Result<Self, ExpandError> {
        let work = staged_work(layout, to, TENSOR_ALIGN).map_err(ExpandError::Work)?;
        for t in targets {
            let tensor = layout
                .get(t.tensor)
                .ok_or(ExpandError::NoTensor { index: t.tensor })?;
            let want = tensor.shape.iter().product::<usize>() * to.size();
            let len = t.span.end.saturating_sub(t.span.start);
            if len != want {
                return Err(ExpandError::WrongSize {
                    tensor: tensor.name.clone(),
                    len,
                    want,
                });
            }
            if overlap(&t.span, &staged) {
                return Err(ExpandError::OverlapsStaged {
                    tensor: tensor.name.clone(),
                });
            }
        }
        let mut spans: Vec<&Range<usize>> = targets
            .iter()
            .map(|t| &t.span)
            .filter(|s| s.start < s.end)
            .collect();
        spans.sort_unstable_by_key(|s| (s.start, s.end));
        if spans.windows(2).any(|w| w[1].start < w[0].end) {
            return Err(ExpandError::Overlap);
        }
        let steps = targets
            .iter()
            .map(|t| ExpandStep {
                tensor: t.tensor,
                scale: work[t.tensor].scale,
            })
            .collect();
        Ok(Expansion {
            to,
            work,
            steps,
            spans: targets.iter().map(|t| t.span.clone()).collect(),
        })
    }

    /// What each target expands, in the order of the targets.
    pub fn steps(&self) -> &[ExpandStep] {
        &self.steps
    }

    /// Expands each planned tensor of `lease` into its destination (`dsts`, in the order of the
    /// targets, at the addresses planned), with `threads` threads per tensor.
    pub fn run(
        &self,
        lease: &Lease,
        dsts: Vec<&mut [u8]>,
        threads: usize,
    ) -> Result<(), ExpandError> {
        let planned = dsts.len() == self.spans.len()
            && dsts.iter().zip(&self.spans).all(|(d, s)| {
                let a = d.as_ptr() as usize;
                (a..a + d.len()) == *s || (d.is_empty() && s.is_empty())
            });
        if !planned {
            return Err(ExpandError::NotPlanned {
                given: dsts.len(),
                planned: self.spans.len(),
            });
        }
        let layout = lease.layout();
        for (step, dst) in self.steps.iter().zip(dsts) {
            let t = &layout[step.tensor];
            let scale = leased_scale(lease, &self.work, step.tensor)?;
            let src = lease.tensor(step.tensor)?;
            dtype::expand_reordered(
                src,
                t.dtype,
                dst,
                self.to,
                rows_cols(&t.shape),
                &scale.scale(),
                t.rows.as_deref(),
                threads,
            )
            .map_err(|source| ExpandError::Convert {
                tensor: t.name.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// Whether two non-empty address ranges share an address.
fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < a.end && b.start < b.end && a.start < b.end && b.start < a.end
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;
