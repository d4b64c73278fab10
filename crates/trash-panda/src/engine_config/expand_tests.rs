use super::*;
use crate::rules::StagedScale;

fn t(name: &str, offset: usize, dtype: DType, shape: &[usize]) -> StagedTensor {
    let len = shape.iter().product::<usize>() * dtype.size();
    StagedTensor {
        name: name.into(),
        offset,
        len,
        dtype,
        shape: shape.to_vec(),
        scale: None,
        rows: None,
    }
}

/// A block of an fp8 weight with a per-row scale, one with a per-tile scale, one with a
/// per-tensor scale, a weight the engine quantized itself, and a bf16 norm.
fn layout() -> Vec<StagedTensor> {
    let mut own = t("own.weight", 0x8000, DType::F8E4M3, &[4, 8]);
    own.scale = Some(StagedScale {
        offset: 0x9000,
        len: 16,
    });
    vec![
        t("a.weight", 0, DType::F8E4M3, &[256, 512]),
        t("a.weight_scale", 0x2_0000, DType::F32, &[256]),
        t("b.weight", 0x2_1000, DType::F8E4M3, &[256, 256]),
        t("b.weight_scale_inv", 0x3_1000, DType::F32, &[2, 2]),
        t("c.weight", 0x3_2000, DType::F8E4M3, &[16, 16]),
        t("c.weight_scale", 0x3_3000, DType::F32, &[]),
        own,
        t("norm.weight", 0x3_4000, DType::BF16, &[512]),
    ]
}

const STAGED: Range<usize> = 0x10_0000..0x20_0000;

/// Destinations laid end to end after the staged block, each the size of its tensor's expansion.
fn targets(layout: &[StagedTensor], tensors: &[usize], to: DType) -> Vec<ExpandTarget> {
    let mut at = 0x40_0000;
    tensors
        .iter()
        .map(|&i| {
            let len = layout[i].shape.iter().product::<usize>() * to.size();
            let span = at..at + len;
            at += len;
            ExpandTarget { tensor: i, span }
        })
        .collect()
}

#[test]
fn each_weight_expands_with_the_scale_its_layout_pairs_it_with() {
    let l = layout();
    let want = [0, 2, 4, 6, 7];
    let e = Expansion::plan(&l, STAGED, &targets(&l, &want, DType::BF16), DType::BF16).unwrap();
    let steps: Vec<_> = e.steps().iter().map(|s| (s.tensor, s.scale)).collect();
    assert_eq!(
        steps,
        [
            (0, Some((ScaleSource::Tensor(1), ScaleLayout::Row))),
            (2, Some((ScaleSource::Tensor(3), ScaleLayout::Block))),
            (4, Some((ScaleSource::Tensor(5), ScaleLayout::Tensor))),
            (6, Some((ScaleSource::Own, ScaleLayout::Row))),
            (7, None),
        ]
    );
}

#[test]
fn destinations_are_sized_in_the_compute_dtype() {
    let l = layout();
    for to in [DType::BF16, DType::F16, DType::F32] {
        let ts = targets(&l, &[0, 7], to);
        assert_eq!(ts[0].span.len(), 256 * 512 * to.size());
        Expansion::plan(&l, STAGED, &ts, to).unwrap();
        let mut short = ts.clone();
        short[1].span.end -= 1;
        let e = Expansion::plan(&l, STAGED, &short, to).unwrap_err();
        assert!(e.is_argument());
        assert_eq!(
            e.to_string(),
            format!(
                "expand_into: the destination of norm.weight holds {} bytes, expected {}",
                512 * to.size() - 1,
                512 * to.size()
            )
        );
    }
}

#[test]
fn a_tensor_not_in_the_block_is_refused() {
    let l = layout();
    let e = Expansion::plan(
        &l,
        STAGED,
        &[ExpandTarget {
            tensor: 8,
            span: 0..0,
        }],
        DType::BF16,
    )
    .unwrap_err();
    assert!(matches!(e, ExpandError::NoTensor { index: 8 }) && e.is_argument());
    assert_eq!(e.to_string(), "expand_into: no tensor #8 in the block");
}

#[test]
fn a_destination_over_the_staged_block_or_another_is_refused() {
    let l = layout();
    let mut ts = targets(&l, &[7], DType::BF16);
    let len = ts[0].span.len();
    ts[0].span = STAGED.end - 1..STAGED.end - 1 + len;
    let e = Expansion::plan(&l, STAGED, &ts, DType::BF16).unwrap_err();
    assert_eq!(
        e.to_string(),
        "expand_into: the destination of norm.weight overlaps the staged block it reads"
    );
    // Touching the staged block's end is not overlapping it.
    ts[0].span = STAGED.end..STAGED.end + len;
    Expansion::plan(&l, STAGED, &ts, DType::BF16).unwrap();

    let mut two = targets(&l, &[4, 7], DType::BF16);
    two[1].span = two[0].span.end - 2..two[0].span.end - 2 + two[1].span.len();
    let e = Expansion::plan(&l, STAGED, &two, DType::BF16).unwrap_err();
    assert!(matches!(e, ExpandError::Overlap) && e.is_argument());
    assert_eq!(e.to_string(), "expand_into: two destinations overlap");
}

#[test]
fn empty_destinations_touch_no_memory() {
    let mut l = layout();
    l.push(t("empty.weight", 0x3_5000, DType::BF16, &[0]));
    let ts = [
        ExpandTarget {
            tensor: 8,
            span: 0x10_0010..0x10_0010,
        },
        ExpandTarget {
            tensor: 8,
            span: 0x10_0010..0x10_0010,
        },
    ];
    // Inside the staged block's addresses, twice, and empty: neither overlaps anything.
    Expansion::plan(&l, STAGED, &ts, DType::BF16).unwrap();
}

#[test]
fn a_scale_that_does_not_fit_its_weight_is_a_dtype_error() {
    let mut l = layout();
    l[1].shape = vec![3, 3];
    let e = Expansion::plan(&l, STAGED, &[], DType::BF16).unwrap_err();
    assert!(matches!(e, ExpandError::Work(DtypeError::ScaleShape { .. })) && !e.is_argument());
    assert!(e.to_string().contains("a.weight_scale"), "{e}");
}
